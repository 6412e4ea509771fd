//! Where a context's connection-manager events go: event channels ([`channel`]: an eventfd
//! and a queue each) and, per context, the router that takes the device's CM events and
//! queues each on its id's channel ([`router`]). Below both the verbs context (whose event
//! thread wakes the router) and the librdmacm API (`rdmacm`, which reads the channels).

pub(crate) mod channel;
pub(crate) mod router;
