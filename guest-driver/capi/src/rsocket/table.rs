//! The process's rsockets by index (the descriptor of each socket's CM channel, as rdma-core
//! hands out: a real descriptor, so indexes never collide with other files).

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::socket::RSocket;

fn sockets() -> &'static Mutex<HashMap<c_int, Arc<RSocket>>> {
    static SOCKETS: OnceLock<Mutex<HashMap<c_int, Arc<RSocket>>>> = OnceLock::new();
    SOCKETS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Files `socket` and returns its index.
pub(crate) fn insert(socket: RSocket) -> c_int {
    let index = socket.index();
    sockets().lock().insert(index, Arc::new(socket));
    index
}

/// The socket of `index`, if it is one.
pub(crate) fn get(index: c_int) -> Option<Arc<RSocket>> {
    sockets().lock().get(&index).cloned()
}

/// Takes the socket of `index` out of the table.
pub(crate) fn remove(index: c_int) -> Option<Arc<RSocket>> {
    sockets().lock().remove(&index)
}
