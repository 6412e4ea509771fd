//! The exported C names.
//!
//! Each entry point is an ordinary Rust function; its C name is a one-instruction assembler
//! stub jumping to it. rustc does not know these names, so they are absent from the anonymous
//! version script it gives the linker for cdylibs, and the named nodes of `libibverbs.map`
//! (rdma-core's versions) apply to them. (An alias made with `.set` would not do: the stub and
//! the function may land in different codegen units, and an alias of an undefined symbol
//! defines nothing.) The data path does not go through these stubs: the `ibv_context_ops`
//! table points at the functions themselves.

macro_rules! export {
    ($($module:ident :: $name:ident),* $(,)?) => {
        $(
            std::arch::global_asm!(
                concat!(".pushsection .text.", stringify!($name), ",\"ax\",@progbits"),
                concat!(".globl ", stringify!($name)),
                concat!(".type ", stringify!($name), ", @function"),
                ".p2align 4",
                concat!(stringify!($name), ":"),
                "jmp {f}",
                concat!(".size ", stringify!($name), ", . - ", stringify!($name)),
                ".popsection",
                f = sym crate::$module::$name,
            );
        )*
        /// Every exported name, for tests.
        #[cfg(test)]
        pub(crate) const EXPORTED: &[&str] = &[$(stringify!($name)),*];
    };
}

export!(
    device::ibv_get_device_list,
    device::ibv_free_device_list,
    device::ibv_get_device_name,
    device::ibv_get_device_guid,
    device::ibv_get_device_index,
    device::ibv_open_device,
    device::ibv_close_device,
    query::ibv_query_device,
    query::ibv_query_port,
    gid_table::ibv_query_gid,
    gid_table::_ibv_query_gid_ex,
    gid_table::_ibv_query_gid_table,
    gid_table::ibv_query_gid_type,
    query::ibv_query_pkey,
    query::ibv_read_sysfs_file,
    query::ibv_get_sysfs_path,
    query::ibv_get_pkey_index,
    marshall::ibv_copy_ah_attr_from_kern,
    marshall::ibv_copy_qp_attr_from_kern,
    marshall::ibv_copy_path_rec_from_kern,
    marshall::ibv_copy_path_rec_to_kern,
    strings::ibv_node_type_str,
    strings::ibv_port_state_str,
    strings::ibv_event_type_str,
    strings::ibv_wc_status_str,
    strings::ibv_rate_to_mult,
    strings::mult_to_ibv_rate,
    strings::ibv_rate_to_mbps,
    strings::mbps_to_ibv_rate,
    objects::ibv_alloc_pd,
    objects::ibv_dealloc_pd,
    objects::ibv_reg_mr,
    objects::ibv_reg_mr_iova,
    objects::ibv_reg_mr_iova2,
    objects::ibv_dereg_mr,
    mr_rereg::ibv_rereg_mr,
    objects::ibv_create_ah,
    objects::ibv_destroy_ah,
    ah_wc::ibv_init_ah_from_wc,
    ah_wc::ibv_create_ah_from_wc,
    srq::ibv_create_srq,
    srq::ibv_modify_srq,
    srq::ibv_query_srq,
    srq::ibv_destroy_srq,
    cq::ibv_create_comp_channel,
    cq::ibv_destroy_comp_channel,
    cq::ibv_create_cq,
    cq::ibv_destroy_cq,
    cq::ibv_resize_cq,
    cq::ibv_get_cq_event,
    cq::ibv_ack_cq_events,
    async_verbs::ibv_get_async_event,
    async_verbs::ibv_ack_async_event,
    qp::ibv_create_qp,
    qp::ibv_modify_qp,
    qp::ibv_query_qp,
    qp::ibv_destroy_qp,
    unsupported::ibv_attach_mcast,
    unsupported::ibv_detach_mcast,
    qp_ex::ibv_qp_to_qp_ex,
    unsupported::ibv_reg_dmabuf_mr,
    unsupported::ibv_query_ece,
    unsupported::ibv_set_ece,
    unsupported::ibv_import_device,
    unsupported::ibv_import_pd,
    unsupported::ibv_import_mr,
    unsupported::ibv_import_dm,
    unsupported::ibv_unimport_pd,
    unsupported::ibv_unimport_mr,
    unsupported::ibv_unimport_dm,
    unsupported::ibv_query_qp_data_in_order,
    fork::ibv_fork_init,
    fork::ibv_is_fork_initialized,
    fork::ibv_dontfork_range,
    fork::ibv_dofork_range,
    eth_l2::ibv_resolve_eth_l2_from_gid,
    rdmacm::rdma_create_event_channel,
    rdmacm::rdma_destroy_event_channel,
    rdmacm::rdma_create_id,
    rdmacm::rdma_destroy_id,
    rdmacm::rdma_bind_addr,
    rdmacm::rdma_resolve_addr,
    rdmacm::rdma_resolve_route,
    rdmacm::rdma_listen,
    rdmacm::rdma_connect,
    rdmacm::rdma_accept,
    rdmacm::rdma_reject,
    rdmacm::rdma_disconnect,
    rdmacm::rdma_notify,
    rdmacm::rdma_set_option,
    rdmacm::rdma_migrate_id,
    rdmacm::rdma_get_src_port,
    rdmacm::rdma_get_dst_port,
    rdmacm::rdma_establish,
    rdmacm::rdma_init_qp_attr,
    rdmacm::rdma_get_cm_event,
    rdmacm::rdma_ack_cm_event,
    rdmacm::rdma_create_qp,
    rdmacm::rdma_create_qp_ex,
    rdmacm::rdma_destroy_qp,
    rdmacm::rdma_create_srq,
    rdmacm::rdma_create_srq_ex,
    rdmacm::rdma_destroy_srq,
    rdmacm::rdma_create_ep,
    rdmacm::rdma_destroy_ep,
    rdmacm::rdma_get_request,
    rdmacm::rdma_getaddrinfo,
    rdmacm::rdma_freeaddrinfo,
    rdmacm::rdma_get_devices,
    rdmacm::rdma_free_devices,
    rdmacm::rdma_event_str,
    rdmacm::rdma_join_multicast,
    rdmacm::rdma_leave_multicast,
    rdmacm::rdma_join_multicast_ex,
    rdmacm::rdma_set_local_ece,
    rdmacm::rdma_get_remote_ece,
    rdmacm::rdma_reject_ece,
    rdmacm::rsocket,
    rdmacm::rbind,
    rdmacm::rlisten,
    rdmacm::raccept,
    rdmacm::rconnect,
    rdmacm::rshutdown,
    rdmacm::rclose,
    rdmacm::rrecv,
    rdmacm::rrecvfrom,
    rdmacm::rrecvmsg,
    rdmacm::rsend,
    rdmacm::rsendto,
    rdmacm::rsendmsg,
    rdmacm::rread,
    rdmacm::rreadv,
    rdmacm::rwrite,
    rdmacm::rwritev,
    rdmacm::rpoll,
    rdmacm::rselect,
    rdmacm::rgetpeername,
    rdmacm::rgetsockname,
    rdmacm::rsetsockopt,
    rdmacm::rgetsockopt,
    rdmacm::rfcntl,
    rdmacm::riomap,
    rdmacm::riounmap,
    rdmacm::riowrite,
);

#[cfg(test)]
mod tests {
    /// Every exported name has a version node in the linker script, and the reverse.
    #[test]
    fn the_version_script_lists_exactly_the_exported_names() {
        let map = include_str!("../libibverbs.map");
        let mut listed: Vec<&str> = map
            .lines()
            .map(str::trim)
            .filter_map(|l| l.strip_suffix(';'))
            .filter(|l| !l.contains(' ') && !l.contains('*') && !l.starts_with('}'))
            .collect();
        listed.sort_unstable();
        let mut exported = super::EXPORTED.to_vec();
        exported.sort_unstable();
        assert_eq!(listed, exported);
    }
}
