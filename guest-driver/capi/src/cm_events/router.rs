//! The routing of one context's CM events: the context's event thread calls
//! [`CmRouter::wake`] for every CM_EVENT notification (and after lost events); it fetches
//! pending events with CM_GET_EVENT and queues each on the channel of its id (a connect
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

/// How many pending events a [`CmRouter::wake`] fetches.
///
/// The device announces every CM event with one CM_EVENT notification (spec §7.5), so a
/// notification stands for one pending event: fetching until the device answers "none" would
/// cost a second round trip per event, and in a burst of n events (n notifications queued
/// behind the first) n more that find nothing. When notifications were lost (`EVENTS_LOST`)
/// the count is unknown, and everything pending is fetched. An event the device dropped
/// meanwhile (its id destroyed) leaves its notification to fetch a later event or nothing; a
/// notification never fetches fewer events than were announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fetch {
    /// The event one notification announced.
    One,
    /// Every pending event.
    All,
}

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

    /// Fetches and routes pending events (the event thread, on a notification): one for a
    /// CM_EVENT notification, all of them after lost events.
    pub(crate) fn wake(&self, fetch: Fetch) {
        fetch_events(
            fetch,
            || self.ctx.next_cm_event(Some(Duration::ZERO)),
            |event| self.route(event),
        );
    }

    /// Queues `event` on its id's channel (a connect request on its listener's).
    fn route(&self, event: CmEventResp) {
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

/// Fetches pending events with `next` (CM_GET_EVENT) as `fetch` says and hands each to
/// `route`; a failed fetch ends it.
fn fetch_events<E: std::fmt::Display>(
    fetch: Fetch,
    mut next: impl FnMut() -> Result<Option<CmEventResp>, E>,
    mut route: impl FnMut(CmEventResp),
) {
    loop {
        match next() {
            Ok(Some(event)) => route(event),
            Ok(None) => return,
            Err(e) => {
                warn!("vrdma: CM_GET_EVENT failed: {e}");
                return;
            }
        }
        if fetch == Fetch::One {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device with `pending` events; counts the CM_GET_EVENTs it answers.
    fn fetch_from(pending: u32, fetch: Fetch) -> (u32, u32) {
        let (mut asked, mut left, mut routed) = (0, pending, 0);
        fetch_events::<std::convert::Infallible>(
            fetch,
            || {
                asked += 1;
                Ok((left > 0).then(|| {
                    left -= 1;
                    CmEventResp::new_zeroed()
                }))
            },
            |_| routed += 1,
        );
        (asked, routed)
    }

    #[test]
    fn a_notification_costs_one_fetch_even_when_more_events_wait() {
        // A burst: three notifications queued, three events pending. Each notification
        // fetches its one event; none asks the device a second time to find nothing.
        assert_eq!(fetch_from(3, Fetch::One), (1, 1));
        // Its event was dropped by the device (id destroyed): one fetch finds nothing.
        assert_eq!(fetch_from(0, Fetch::One), (1, 0));
    }

    #[test]
    fn after_lost_notifications_everything_pending_is_fetched() {
        assert_eq!(fetch_from(3, Fetch::All), (4, 3));
        assert_eq!(fetch_from(0, Fetch::All), (1, 0));
    }

    #[test]
    fn a_failed_fetch_ends_the_wake_up() {
        let mut asked = 0;
        fetch_events(
            Fetch::All,
            || {
                asked += 1;
                Err("transport gone")
            },
            |_| unreachable!("nothing was fetched"),
        );
        assert_eq!(asked, 1);
    }
}
