//! A drop-in librdmacm: rdma-core's `librdmacm.so.1` API over the device's connection manager
//! (spec §7.5), in the same shared object as the drop-in libibverbs.
//!
//! `librdmacm.so.1` is a second name of this library's file (a symbolic link): the dynamic
//! loader sees that both names are one file and loads it once, and its `RDMACM_1.*` version
//! nodes satisfy the imports of programs linked against rdma-core's librdmacm. So the CM
//! shares everything with the verbs: the context an id's `verbs` points at is an ordinary
//! context of this library, its QPs are this library's QPs, and its events come through that
//! context's event thread.
//!
//! Layers: [`id`] (ids and the commands on them), [`event`] (`rdma_get_cm_event`: the work
//! librdmacm does per event, QP state moves included), [`qp`] (QPs, SRQs and endpoints of
//! ids), [`addrinfo`] (`rdma_getaddrinfo`), [`device`] (the one device context ids use),
//! [`sockaddr`] (C socket addresses), [`unsupported`] (multicast, ECE and rsockets:
//! `ENOSYS`/`EOPNOTSUPP`). Event channels and the router that fills them are below the verbs
//! context, in `cm_events`.

pub(crate) mod addrinfo;
pub(crate) mod cm_id;
pub(crate) mod device;
pub(crate) mod event;
pub(crate) mod id;
pub(crate) mod qp;
pub(crate) mod sockaddr;
pub(crate) mod unsupported;

pub(crate) use crate::cm_events::channel::{rdma_create_event_channel, rdma_destroy_event_channel};
pub(crate) use addrinfo::{rdma_freeaddrinfo, rdma_getaddrinfo};
pub(crate) use device::{rdma_event_str, rdma_free_devices, rdma_get_devices};
pub(crate) use event::{rdma_ack_cm_event, rdma_get_cm_event};
pub(crate) use id::{
    rdma_accept, rdma_bind_addr, rdma_connect, rdma_create_id, rdma_destroy_id, rdma_disconnect,
    rdma_establish, rdma_get_dst_port, rdma_get_src_port, rdma_init_qp_attr, rdma_listen,
    rdma_migrate_id, rdma_notify, rdma_reject, rdma_resolve_addr, rdma_resolve_route,
    rdma_set_option,
};
pub(crate) use qp::{
    rdma_create_ep, rdma_create_qp, rdma_create_qp_ex, rdma_create_srq, rdma_create_srq_ex,
    rdma_destroy_ep, rdma_destroy_qp, rdma_destroy_srq, rdma_get_request,
};
pub(crate) use unsupported::*;
