//! The routing of one context's CM events: the context's event thread calls
//! [`CmRouter::wake`] for every CM_EVENT notification (and after lost events); it fetches
//! every pending event with CM_GET_EVENT and queues each on the channel of its id (a connect
//! request on its listener's). An event of an id the application destroyed meanwhile is
//! dropped; a connect request whose listener is gone is refused by destroying its new id.
//! When the device goes away (the transport failed: the backend died), every id gets
//! `RDMA_CM_EVENT_DEVICE_REMOVAL`, as the kernel's rdma_cm reports a removed device.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use log::{debug, warn};
use parking_lot::Mutex;
use vrdma::spec::cm::{cm_event, CmEventResp};
use vrdma::spec::Le32;
use vrdma::verbs::cm::{CmId, PortSpace};
use vrdma::Context;
use zerocopy::FromZeros;

use super::channel::CmChannel;
use super::cm_id::CmIdPriv;
use crate::sys::rdma_cm_id;

/// Where the events of one id go.
#[derive(Clone)]
pub(crate) struct IdRoute {
    pub(crate) channel: Arc<CmChannel>,
    /// The application's id (`*mut rdma_cm_id`).
    pub(crate) id: usize,
}

/// The CM event routes of one context.
pub(crate) struct CmRouter {
    ctx: Context,
    ids: Mutex<HashMap<u32, IdRoute>>,
}

impl CmRouter {
    pub(crate) fn new(ctx: Context) -> CmRouter {
        CmRouter {
            ctx,
            ids: Mutex::new(HashMap::new()),
        }
    }

    /// Routes the events of id `handle` (the application's `id`) to `channel` from now on.
    pub(crate) fn add(&self, handle: u32, channel: Arc<CmChannel>, id: *mut rdma_cm_id) {
        self.ids.lock().insert(
            handle,
            IdRoute {
                channel,
                id: id as usize,
            },
        );
    }

    /// The application's id of `handle`, if it is not destroyed, with one more event counted
    /// as handed out on it (`given`), so that `rdma_destroy_id`, which removes the route
    /// under this lock before it waits for `acknowledged` to reach `given`, cannot free it
    /// while the event is being delivered. The caller hands the event out, or
    /// [`CmRouter::unclaim`]s it.
    pub(crate) fn claim(&self, handle: u32) -> Option<*mut rdma_cm_id> {
        let ids = self.ids.lock();
        let id = ids.get(&handle)?.id as *mut rdma_cm_id;
        // SAFETY: a routed id is live: its route goes (under the lock held here) before it is
        // freed.
        unsafe { (*id.cast::<CmIdPriv>()).state.lock().given += 1 };
        Some(id)
    }

    /// Gives back a [`CmRouter::claim`] whose event was not handed out.
    ///
    /// # Safety
    /// `id` was claimed and not unclaimed or acknowledged since.
    pub(crate) unsafe fn unclaim(id: *mut rdma_cm_id) {
        // SAFETY: caller contract: the claim keeps the id alive.
        let p = unsafe { &*id.cast::<CmIdPriv>() };
        p.state.lock().acknowledged += 1;
        p.acked.notify_all();
    }

    /// Stops routing the events of id `handle`, and drops those queued already.
    pub(crate) fn remove(&self, handle: u32) {
        if let Some(route) = self.ids.lock().remove(&handle) {
            route.channel.purge(handle);
        }
    }

    /// Moves id `handle`'s events to `channel` (`rdma_migrate_id`): those queued go along.
    pub(crate) fn migrate(&self, handle: u32, channel: Arc<CmChannel>) {
        if let Some(route) = self.ids.lock().get_mut(&handle) {
            route.channel = channel;
        }
    }

    /// Fetches and routes every pending event (the event thread, on a notification).
    pub(crate) fn wake(&self) {
        loop {
            let event = match self.ctx.next_cm_event(Some(Duration::ZERO)) {
                Ok(Some(event)) => event,
                Ok(None) => return,
                Err(e) => {
                    warn!("vrdma: CM_GET_EVENT failed: {e}");
                    return;
                }
            };
            let request = event.event.get() == cm_event::CONNECT_REQUEST;
            let target = if request {
                event.listen_id.get()
            } else {
                event.id.get()
            };
            let route = self.ids.lock().get(&target).cloned();
            match route {
                Some(route) => route.channel.push(Box::new(event)),
                None if request => {
                    debug!("vrdma: connect request for a destroyed listener refused");
                    self.refuse(&event);
                }
                None => debug!(
                    "vrdma: CM event {} of destroyed id {target:#x} dropped",
                    event.event.get()
                ),
            }
        }
    }

    /// The device is gone: queues `RDMA_CM_EVENT_DEVICE_REMOVAL` for every id (the event thread
    /// calls this once, when it ends on a failed transport), so that an application blocked in
    /// `rdma_get_cm_event` learns it instead of waiting forever.
    pub(crate) fn device_gone(&self) {
        let routes: Vec<(u32, Arc<CmChannel>)> = self
            .ids
            .lock()
            .iter()
            .map(|(&handle, route)| (handle, Arc::clone(&route.channel)))
            .collect();
        for (handle, channel) in routes {
            let mut event = CmEventResp::new_zeroed();
            event.id = Le32::new(handle);
            event.event = Le32::new(cm_event::DEVICE_REMOVAL);
            channel.push(Box::new(event));
        }
    }

    /// Destroys a connect request's id nobody will see (the peer is rejected).
    fn refuse(&self, request: &vrdma::spec::cm::CmEventResp) {
        match CmId::from_request(&self.ctx, request, PortSpace::Tcp) {
            Ok(id) => drop(id),
            Err(e) => warn!("vrdma: refusing a connect request: {e}"),
        }
    }
}
