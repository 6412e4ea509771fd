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

    /// The application's id of `handle`, if it is not destroyed, after `count` ran on it
    /// under the routes' lock: `rdma_destroy_id` removes the route under that lock before it
    /// waits for the id's events, so what `count` records (an event being handed out) keeps
    /// the id alive.
    pub(crate) fn claim(
        &self,
        handle: u32,
        count: impl FnOnce(*mut rdma_cm_id),
    ) -> Option<*mut rdma_cm_id> {
        let ids = self.ids.lock();
        let id = ids.get(&handle)?.id as *mut rdma_cm_id;
        count(id);
        Some(id)
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
            log::trace!(
                "vrdma: CM event {} of id {:#x} (target {target:#x}): {}",
                event.event.get(),
                event.id.get(),
                if route.is_some() {
                    "routed"
                } else {
                    "no route"
                }
            );
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
