//! Feeds arbitrary bytes to every vrdma decoder; anything that decodes must re-encode
//! to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vrdma_spec::{ControlRequest, ControlResponse, DeviceConfig, Doorbell, Event, Opcode};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = ControlRequest::decode(data) {
        assert_eq!(req.to_vec(), data);
    }
    for op in Opcode::ALL {
        if let Ok(resp) = ControlResponse::decode(op, data) {
            assert_eq!(resp.to_vec(), data);
        }
    }
    if let Ok(ev) = Event::decode(data) {
        assert_eq!(ev.to_bytes().as_slice(), data);
    }
    if let Ok(db) = Doorbell::decode(data, 4096) {
        let mut v = Vec::new();
        Doorbell::encode_into(db.handles(), &mut v);
        assert_eq!(v, data);
    }
    let _ = DeviceConfig::decode(data);
});
