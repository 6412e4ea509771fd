//! rdma-core's converters between the kernel's uverbs/SA structures and the verbs ones, which
//! librdmacm imports from libibverbs (it exchanges those structures with the RDMA CM device).
//! Plain field copies, as in rdma-core's `marshall.c`; `qp_state` is not copied there either.

use crate::sys::{
    ib_user_path_rec, ib_uverbs_ah_attr, ib_uverbs_qp_attr, ibv_ah_attr, ibv_qp_attr,
    ibv_sa_path_rec,
};

fn ah_attr_from_kern(dst: &mut ibv_ah_attr, src: &ib_uverbs_ah_attr) {
    dst.grh.dgid.raw = src.grh.dgid;
    dst.grh.flow_label = src.grh.flow_label;
    dst.grh.sgid_index = src.grh.sgid_index;
    dst.grh.hop_limit = src.grh.hop_limit;
    dst.grh.traffic_class = src.grh.traffic_class;
    dst.dlid = src.dlid;
    dst.sl = src.sl;
    dst.src_path_bits = src.src_path_bits;
    dst.static_rate = src.static_rate;
    dst.is_global = src.is_global;
    dst.port_num = src.port_num;
}

fn qp_attr_from_kern(dst: &mut ibv_qp_attr, src: &ib_uverbs_qp_attr) {
    dst.cur_qp_state = src.cur_qp_state;
    dst.path_mtu = src.path_mtu;
    dst.path_mig_state = src.path_mig_state;
    dst.qkey = src.qkey;
    dst.rq_psn = src.rq_psn;
    dst.sq_psn = src.sq_psn;
    dst.dest_qp_num = src.dest_qp_num;
    dst.qp_access_flags = src.qp_access_flags;
    dst.cap.max_send_wr = src.max_send_wr;
    dst.cap.max_recv_wr = src.max_recv_wr;
    dst.cap.max_send_sge = src.max_send_sge;
    dst.cap.max_recv_sge = src.max_recv_sge;
    dst.cap.max_inline_data = src.max_inline_data;
    ah_attr_from_kern(&mut dst.ah_attr, &src.ah_attr);
    ah_attr_from_kern(&mut dst.alt_ah_attr, &src.alt_ah_attr);
    dst.pkey_index = src.pkey_index;
    dst.alt_pkey_index = src.alt_pkey_index;
    dst.en_sqd_async_notify = src.en_sqd_async_notify;
    dst.sq_draining = src.sq_draining;
    dst.max_rd_atomic = src.max_rd_atomic;
    dst.max_dest_rd_atomic = src.max_dest_rd_atomic;
    dst.min_rnr_timer = src.min_rnr_timer;
    dst.port_num = src.port_num;
    dst.timeout = src.timeout;
    dst.retry_cnt = src.retry_cnt;
    dst.rnr_retry = src.rnr_retry;
    dst.alt_port_num = src.alt_port_num;
    dst.alt_timeout = src.alt_timeout;
}

fn path_rec_from_kern(dst: &mut ibv_sa_path_rec, src: &ib_user_path_rec) {
    dst.dgid.raw = src.dgid;
    dst.sgid.raw = src.sgid;
    dst.dlid = src.dlid;
    dst.slid = src.slid;
    // C's u32-to-int conversions.
    dst.raw_traffic = src.raw_traffic as i32;
    dst.flow_label = src.flow_label;
    dst.hop_limit = src.hop_limit;
    dst.traffic_class = src.traffic_class;
    dst.reversible = src.reversible as i32;
    dst.numb_path = src.numb_path;
    dst.pkey = src.pkey;
    dst.sl = src.sl;
    dst.mtu_selector = src.mtu_selector;
    // The kernel's mtu is an IB MTU enum value (1..=5): it fits.
    dst.mtu = src.mtu as u8;
    dst.rate_selector = src.rate_selector;
    dst.rate = src.rate;
    dst.packet_life_time = src.packet_life_time;
    dst.preference = src.preference;
    dst.packet_life_time_selector = src.packet_life_time_selector;
}

fn path_rec_to_kern(dst: &mut ib_user_path_rec, src: &ibv_sa_path_rec) {
    // SAFETY: `ibv_gid` is a union of plain bytes and integers: every bit pattern is valid
    // as its `raw` bytes.
    (dst.dgid, dst.sgid) = unsafe { (src.dgid.raw, src.sgid.raw) };
    dst.dlid = src.dlid;
    dst.slid = src.slid;
    // C's int-to-u32 conversions.
    dst.raw_traffic = src.raw_traffic as u32;
    dst.flow_label = src.flow_label;
    dst.reversible = src.reversible as u32;
    dst.mtu = src.mtu.into();
    dst.pkey = src.pkey;
    dst.hop_limit = src.hop_limit;
    dst.traffic_class = src.traffic_class;
    dst.numb_path = src.numb_path;
    dst.sl = src.sl;
    dst.mtu_selector = src.mtu_selector;
    dst.rate_selector = src.rate_selector;
    dst.rate = src.rate;
    dst.packet_life_time_selector = src.packet_life_time_selector;
    dst.packet_life_time = src.packet_life_time;
    dst.preference = src.preference;
}

/// `ibv_copy_ah_attr_from_kern` (IBVERBS_1.1).
///
/// # Safety
/// `dst` is valid for writes and `src` for reads (NULL is ignored).
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *const ib_uverbs_ah_attr,
) {
    // SAFETY: caller contract; `as_mut`/`as_ref` turn NULL into None.
    if let (Some(dst), Some(src)) = unsafe { (dst.as_mut(), src.as_ref()) } {
        ah_attr_from_kern(dst, src);
    }
}

/// `ibv_copy_qp_attr_from_kern` (IBVERBS_1.0).
///
/// # Safety
/// `dst` is valid for writes and `src` for reads (NULL is ignored).
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *const ib_uverbs_qp_attr,
) {
    // SAFETY: caller contract; `as_mut`/`as_ref` turn NULL into None.
    if let (Some(dst), Some(src)) = unsafe { (dst.as_mut(), src.as_ref()) } {
        qp_attr_from_kern(dst, src);
    }
}

/// `ibv_copy_path_rec_from_kern` (IBVERBS_1.0).
///
/// # Safety
/// `dst` is valid for writes and `src` for reads (NULL is ignored).
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *const ib_user_path_rec,
) {
    // SAFETY: caller contract; `as_mut`/`as_ref` turn NULL into None.
    if let (Some(dst), Some(src)) = unsafe { (dst.as_mut(), src.as_ref()) } {
        path_rec_from_kern(dst, src);
    }
}

/// `ibv_copy_path_rec_to_kern` (IBVERBS_1.0).
///
/// # Safety
/// `dst` is valid for writes and `src` for reads (NULL is ignored).
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *const ibv_sa_path_rec,
) {
    // SAFETY: caller contract; `as_mut`/`as_ref` turn NULL into None.
    if let (Some(dst), Some(src)) = unsafe { (dst.as_mut(), src.as_ref()) } {
        path_rec_to_kern(dst, src);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zeroed<T>() -> T {
        // SAFETY: only used for the plain C structures of sys.rs, for which all-zero is valid.
        unsafe { std::mem::zeroed() }
    }

    #[test]
    fn qp_attr_copies_every_field_and_both_address_vectors() {
        let mut src: ib_uverbs_qp_attr = zeroed();
        src.qp_state = 3;
        src.cur_qp_state = 2;
        src.path_mtu = 3;
        src.qkey = 0x1111_1111;
        src.rq_psn = 7;
        src.sq_psn = 8;
        src.dest_qp_num = 0x12;
        src.qp_access_flags = 0xe;
        src.max_send_wr = 64;
        src.max_inline_data = 28;
        src.ah_attr.grh.dgid = [0xfe; 16];
        src.ah_attr.grh.sgid_index = 1;
        src.ah_attr.is_global = 1;
        src.ah_attr.port_num = 1;
        src.alt_ah_attr.dlid = 0x42;
        src.pkey_index = 5;
        src.max_rd_atomic = 16;
        src.timeout = 14;
        src.rnr_retry = 7;
        src.alt_timeout = 9;
        let mut dst: ibv_qp_attr = zeroed();
        // SAFETY: both point at live locals.
        unsafe { ibv_copy_qp_attr_from_kern(&mut dst, &src) };
        assert_eq!(dst.qp_state, 0, "rdma-core does not copy qp_state either");
        assert_eq!((dst.cur_qp_state, dst.path_mtu), (2, 3));
        assert_eq!((dst.qkey, dst.rq_psn, dst.sq_psn), (0x1111_1111, 7, 8));
        assert_eq!((dst.dest_qp_num, dst.qp_access_flags), (0x12, 0xe));
        assert_eq!((dst.cap.max_send_wr, dst.cap.max_inline_data), (64, 28));
        // SAFETY: reading the raw view of a plain union of bytes.
        assert_eq!(unsafe { dst.ah_attr.grh.dgid.raw }, [0xfe; 16]);
        assert_eq!(
            (
                dst.ah_attr.grh.sgid_index,
                dst.ah_attr.is_global,
                dst.ah_attr.port_num
            ),
            (1, 1, 1)
        );
        assert_eq!(dst.alt_ah_attr.dlid, 0x42);
        assert_eq!((dst.pkey_index, dst.max_rd_atomic), (5, 16));
        assert_eq!((dst.timeout, dst.rnr_retry, dst.alt_timeout), (14, 7, 9));
    }

    #[test]
    fn path_rec_keeps_network_order_fields_as_they_are() {
        let mut src: ib_user_path_rec = zeroed();
        src.dgid = [1; 16];
        src.sgid = [2; 16];
        src.dlid = 0x0100u16.to_be();
        src.flow_label = 0x1234u32.to_be();
        src.pkey = 0xffffu16.to_be();
        src.reversible = 1;
        src.mtu = 4;
        src.packet_life_time_selector = 2;
        src.preference = 3;
        let mut dst: ibv_sa_path_rec = zeroed();
        // SAFETY: both point at live locals.
        unsafe { ibv_copy_path_rec_from_kern(&mut dst, &src) };
        // SAFETY: reading the raw view of plain unions of bytes.
        assert_eq!(unsafe { (dst.dgid.raw, dst.sgid.raw) }, ([1; 16], [2; 16]));
        assert_eq!((dst.dlid, dst.flow_label), (src.dlid, src.flow_label));
        assert_eq!((dst.pkey, dst.reversible, dst.mtu), (src.pkey, 1, 4));
        assert_eq!((dst.packet_life_time_selector, dst.preference), (2, 3));

        // And back: every field returns as the kernel gave it.
        let mut back: ib_user_path_rec = zeroed();
        // SAFETY: both point at live locals.
        unsafe { ibv_copy_path_rec_to_kern(&mut back, &dst) };
        assert_eq!((back.dgid, back.sgid), (src.dgid, src.sgid));
        assert_eq!(
            (back.dlid, back.flow_label, back.pkey),
            (src.dlid, src.flow_label, src.pkey)
        );
        assert_eq!((back.reversible, back.mtu), (1, 4));
        assert_eq!((back.packet_life_time_selector, back.preference), (2, 3));
    }

    #[test]
    fn null_arguments_are_ignored() {
        let src: ib_uverbs_ah_attr = zeroed();
        // SAFETY: NULL is documented to be ignored.
        unsafe {
            ibv_copy_ah_attr_from_kern(std::ptr::null_mut(), &src);
            ibv_copy_qp_attr_from_kern(std::ptr::null_mut(), std::ptr::null());
            ibv_copy_path_rec_from_kern(std::ptr::null_mut(), std::ptr::null());
            ibv_copy_path_rec_to_kern(std::ptr::null_mut(), std::ptr::null());
        }
    }
}
