//! The host device implementation for Soft-RoCE (`rdma_rxe`), entirely over the uverbs write
//! ABI: rxe allocates every queue buffer in the kernel and lets user space map it once from the
//! context's cmd fd, so this layer creates queues itself and hands (fd, offset, len) onwards.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use vrdma_spec::verbs::{AccessFlags, QpAttrMask, QpState};
use zerocopy::IntoBytes;

use super::error::{DeviceError, Result};
use super::events::EventFd;
use super::rxe_abi::{
    MmInfo, RxeCreateAhResp, RxeCreateCqResp, RxeCreateQpResp, RxeCreateSrqResp, RxeModifySrqCmd,
};
use super::sysfs::{self, DeviceInfo, GidEntry};
use super::types::*;
use super::uverbs::{self, FramedKick, PostSendResp};
use super::verbs_file::VerbsFile;
use super::{HostContext, HostDevice};

/// `RXE_VENDOR_ID` (drivers/infiniband/sw/rxe/rxe_param.h): what QUERY_DEVICE reports for rxe.
pub const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

/// `IB_SRQ_MAX_WR`.
const SRQ_MAX_WR: u32 = 1;
/// `IB_SRQ_LIMIT`.
const SRQ_LIMIT: u32 = 2;

/// An rxe device on this host.
#[derive(Debug, Clone)]
pub struct RxeDevice {
    info: DeviceInfo,
    sysfs_root: std::path::PathBuf,
}

impl RxeDevice {
    /// Finds the device (`name`, or the first with an ACTIVE port) under the given sysfs and dev
    /// roots and checks that rxe drives it.
    pub fn find(sysfs_root: &Path, dev_root: &Path, name: Option<&str>) -> Result<RxeDevice> {
        let info = sysfs::find_device(sysfs_root, dev_root, name)?;
        if info.driver != "rxe" {
            return Err(DeviceError::UnsupportedDriver {
                name: info.name,
                driver: info.driver,
            });
        }
        Ok(RxeDevice {
            info,
            sysfs_root: sysfs_root.to_owned(),
        })
    }

    /// [`RxeDevice::find`] on the live system (`/sys`, `/dev`).
    pub fn find_system(name: Option<&str>) -> Result<RxeDevice> {
        RxeDevice::find(
            Path::new(sysfs::SYSFS_ROOT),
            Path::new(sysfs::DEV_ROOT),
            name,
        )
    }

    /// Opens a context with the concrete type (tests and tools that want rxe specifics).
    pub fn open(&self) -> Result<RxeContext> {
        RxeContext::open(&self.info)
    }
}

impl HostDevice for RxeDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn ring_format(&self) -> u32 {
        vrdma_spec::config::ring_format::RXE_V1
    }

    fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        sysfs::gid_table(&self.sysfs_root, &self.info.name, port)
    }

    fn gid_entry(&self, port: u8, index: u32) -> Result<Option<GidEntry>> {
        sysfs::gid_entry(&self.sysfs_root, &self.info.name, port, index)
    }

    fn open_context(&self) -> Result<Box<dyn HostContext>> {
        Ok(Box::new(self.open()?))
    }
}

/// Kernel objects a context holds, so that dropping it destroys them in dependency order.
#[derive(Debug, Default)]
struct LiveObjects {
    pds: BTreeSet<u32>,
    mrs: BTreeSet<u32>,
    cqs: BTreeSet<u32>,
    qps: BTreeSet<u32>,
    srqs: BTreeSet<u32>,
    ahs: BTreeSet<u32>,
}

/// One uverbs context on an rxe device (one per guest connection).
#[derive(Debug)]
pub struct RxeContext {
    file: VerbsFile,
    async_events: EventFd,
    comp_channel: EventFd,
    num_comp_vectors: u32,
    live: Mutex<LiveObjects>,
}

fn queue_buffer(command: &'static str, mi: &MmInfo) -> Result<QueueBuffer> {
    if mi.size == 0 {
        return Err(DeviceError::InvalidReply {
            command,
            reason: "queue buffer of size 0".into(),
        });
    }
    Ok(QueueBuffer {
        offset: mi.offset,
        len: mi.size as usize,
    })
}

fn dest_from_attr(ah: &AhAttr) -> uverbs::QpDest {
    uverbs::QpDest {
        dgid: ah.dgid,
        flow_label: ah.flow_label,
        dlid: ah.dlid,
        reserved: 0,
        sgid_index: ah.sgid_index,
        hop_limit: ah.hop_limit,
        traffic_class: ah.traffic_class,
        sl: ah.sl,
        src_path_bits: ah.src_path_bits,
        static_rate: ah.static_rate,
        is_global: u8::from(ah.is_global),
        port_num: ah.port_num,
    }
}

fn attr_from_dest(dest: &uverbs::QpDest) -> AhAttr {
    AhAttr {
        dgid: dest.dgid,
        flow_label: dest.flow_label,
        sgid_index: dest.sgid_index,
        hop_limit: dest.hop_limit,
        traffic_class: dest.traffic_class,
        dlid: dest.dlid,
        sl: dest.sl,
        src_path_bits: dest.src_path_bits,
        static_rate: dest.static_rate,
        is_global: dest.is_global != 0,
        port_num: dest.port_num,
    }
}

/// Builds `struct ib_uverbs_modify_qp` the way rdma-core's `copy_modify_qp_fields` does: only
/// the fields selected by `mask` are copied, everything else stays zero.
pub fn encode_modify_qp(qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> uverbs::ModifyQp {
    let mut cmd = uverbs::ModifyQp {
        qp_handle: qp.0,
        attr_mask: mask.bits(),
        ..Default::default()
    };
    if mask.contains(QpAttrMask::STATE) {
        cmd.qp_state = attr.qp_state as u8;
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        cmd.cur_qp_state = attr.cur_qp_state as u8;
    }
    if mask.contains(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
        cmd.en_sqd_async_notify = u8::from(attr.en_sqd_async_notify);
    }
    if mask.contains(QpAttrMask::ACCESS_FLAGS) {
        cmd.qp_access_flags = attr.qp_access_flags.bits();
    }
    if mask.contains(QpAttrMask::PKEY_INDEX) {
        cmd.pkey_index = attr.pkey_index;
    }
    if mask.contains(QpAttrMask::PORT) {
        cmd.port_num = attr.port_num;
    }
    if mask.contains(QpAttrMask::QKEY) {
        cmd.qkey = attr.qkey;
    }
    if mask.contains(QpAttrMask::AV) {
        cmd.dest = dest_from_attr(&attr.ah_attr);
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        cmd.path_mtu = attr.path_mtu;
    }
    if mask.contains(QpAttrMask::TIMEOUT) {
        cmd.timeout = attr.timeout;
    }
    if mask.contains(QpAttrMask::RETRY_CNT) {
        cmd.retry_cnt = attr.retry_cnt;
    }
    if mask.contains(QpAttrMask::RNR_RETRY) {
        cmd.rnr_retry = attr.rnr_retry;
    }
    if mask.contains(QpAttrMask::RQ_PSN) {
        cmd.rq_psn = attr.rq_psn;
    }
    if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
        cmd.max_rd_atomic = attr.max_rd_atomic;
    }
    if mask.contains(QpAttrMask::ALT_PATH) {
        cmd.alt_pkey_index = attr.alt_pkey_index;
        cmd.alt_port_num = attr.alt_port_num;
        cmd.alt_timeout = attr.alt_timeout;
        cmd.alt_dest = dest_from_attr(&attr.alt_ah_attr);
    }
    if mask.contains(QpAttrMask::MIN_RNR_TIMER) {
        cmd.min_rnr_timer = attr.min_rnr_timer;
    }
    if mask.contains(QpAttrMask::SQ_PSN) {
        cmd.sq_psn = attr.sq_psn;
    }
    if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
        cmd.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    }
    if mask.contains(QpAttrMask::PATH_MIG_STATE) {
        cmd.path_mig_state = attr.path_mig_state;
    }
    if mask.contains(QpAttrMask::DEST_QPN) {
        cmd.dest_qp_num = attr.dest_qp_num;
    }
    cmd
}

fn decode_query_qp(resp: &uverbs::QueryQpResp) -> Result<QpInfo> {
    let state = |value: u8| {
        QpState::try_from(u32::from(value)).map_err(|_| DeviceError::InvalidReply {
            command: "QUERY_QP",
            reason: format!("unknown QP state {value}"),
        })
    };
    Ok(QpInfo {
        attr: QpAttr {
            qp_state: state(resp.qp_state)?,
            cur_qp_state: state(resp.cur_qp_state)?,
            path_mtu: resp.path_mtu,
            path_mig_state: resp.path_mig_state,
            qkey: resp.qkey,
            rq_psn: resp.rq_psn,
            sq_psn: resp.sq_psn,
            dest_qp_num: resp.dest_qp_num,
            qp_access_flags: AccessFlags::from_bits_retain(resp.qp_access_flags),
            ah_attr: attr_from_dest(&resp.dest),
            alt_ah_attr: attr_from_dest(&resp.alt_dest),
            pkey_index: resp.pkey_index,
            alt_pkey_index: resp.alt_pkey_index,
            en_sqd_async_notify: false,
            sq_draining: resp.sq_draining != 0,
            max_rd_atomic: resp.max_rd_atomic,
            max_dest_rd_atomic: resp.max_dest_rd_atomic,
            min_rnr_timer: resp.min_rnr_timer,
            port_num: resp.port_num,
            timeout: resp.timeout,
            retry_cnt: resp.retry_cnt,
            rnr_retry: resp.rnr_retry,
            alt_port_num: resp.alt_port_num,
            alt_timeout: resp.alt_timeout,
        },
        caps: QpCaps {
            max_send_wr: resp.max_send_wr,
            max_recv_wr: resp.max_recv_wr,
            max_send_sge: resp.max_send_sge,
            max_recv_sge: resp.max_recv_sge,
            max_inline_data: resp.max_inline_data,
        },
        sq_sig_all: resp.sq_sig_all != 0,
    })
}

fn device_attr(r: &uverbs::QueryDeviceResp) -> DeviceAttr {
    DeviceAttr {
        fw_ver: r.fw_ver,
        // The kernel stores these big-endian; the raw bytes are the wire order.
        node_guid: r.node_guid.to_ne_bytes(),
        sys_image_guid: r.sys_image_guid.to_ne_bytes(),
        max_mr_size: r.max_mr_size,
        page_size_cap: r.page_size_cap,
        vendor_id: r.vendor_id,
        vendor_part_id: r.vendor_part_id,
        hw_ver: r.hw_ver,
        max_qp: r.max_qp,
        max_qp_wr: r.max_qp_wr,
        device_cap_flags: r.device_cap_flags,
        max_sge: r.max_sge,
        max_sge_rd: r.max_sge_rd,
        max_cq: r.max_cq,
        max_cqe: r.max_cqe,
        max_mr: r.max_mr,
        max_pd: r.max_pd,
        max_qp_rd_atom: r.max_qp_rd_atom,
        max_res_rd_atom: r.max_res_rd_atom,
        max_qp_init_rd_atom: r.max_qp_init_rd_atom,
        atomic_cap: r.atomic_cap,
        max_mw: r.max_mw,
        max_mcast_grp: r.max_mcast_grp,
        max_mcast_qp_attach: r.max_mcast_qp_attach,
        max_total_mcast_qp_attach: r.max_total_mcast_qp_attach,
        max_ah: r.max_ah,
        max_srq: r.max_srq,
        max_srq_wr: r.max_srq_wr,
        max_srq_sge: r.max_srq_sge,
        max_pkeys: r.max_pkeys,
        local_ca_ack_delay: r.local_ca_ack_delay,
        phys_port_cnt: r.phys_port_cnt,
    }
}

fn port_attr(r: &uverbs::QueryPortResp) -> PortAttr {
    PortAttr {
        state: r.state,
        max_mtu: r.max_mtu,
        active_mtu: r.active_mtu,
        gid_tbl_len: r.gid_tbl_len,
        port_cap_flags: r.port_cap_flags,
        max_msg_sz: r.max_msg_sz,
        bad_pkey_cntr: r.bad_pkey_cntr,
        qkey_viol_cntr: r.qkey_viol_cntr,
        pkey_tbl_len: r.pkey_tbl_len,
        lid: r.lid,
        sm_lid: r.sm_lid,
        lmc: r.lmc,
        max_vl_num: r.max_vl_num,
        sm_sl: r.sm_sl,
        subnet_timeout: r.subnet_timeout,
        init_type_reply: r.init_type_reply,
        active_width: r.active_width,
        active_speed: r.active_speed,
        phys_state: r.phys_state,
        link_layer: r.link_layer,
        flags: r.flags,
    }
}

impl RxeContext {
    /// Opens the device's uverbs node, allocates the kernel context (GET_CONTEXT), creates the
    /// context's completion channel, and checks that the device really is rxe.
    pub fn open(info: &DeviceInfo) -> Result<RxeContext> {
        let file = VerbsFile::open(&info.uverbs_path)?;
        let (ctx, ()) = file.execute(uverbs::GetContext::default(), &[])?;
        let async_events = EventFd::from_kernel("GET_CONTEXT", ctx.async_fd)?;
        let (chan, ()) = file.execute(uverbs::CreateCompChannel::default(), &[])?;
        let comp_channel = EventFd::from_kernel("CREATE_COMP_CHANNEL", chan.fd)?;
        let context = RxeContext {
            file,
            async_events,
            comp_channel,
            num_comp_vectors: ctx.num_comp_vectors,
            live: Mutex::new(LiveObjects::default()),
        };
        let attr = context.query_device()?;
        if attr.vendor_id != RXE_VENDOR_ID {
            return Err(DeviceError::UnsupportedDriver {
                name: info.name.clone(),
                driver: format!("vendor {:#x}", attr.vendor_id),
            });
        }
        log::debug!(
            "opened {} ({}): {} completion vectors",
            info.name,
            info.uverbs_path.display(),
            context.num_comp_vectors
        );
        Ok(context)
    }

    fn live(&self) -> MutexGuard<'_, LiveObjects> {
        // Bookkeeping stays consistent even if a thread panicked while holding the lock: every
        // update is a single insert or remove.
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn destroy_all(&self) {
        let live = std::mem::take(&mut *self.live());
        // Reverse dependency order: AHs and QPs use PDs, CQs and SRQs; MRs use PDs.
        for ah in live.ahs {
            self.log_destroy("AH", ah, self.destroy_ah_raw(ah));
        }
        for qp in live.qps {
            self.log_destroy("QP", qp, self.destroy_qp_raw(qp).map(|_| ()));
        }
        for srq in live.srqs {
            self.log_destroy("SRQ", srq, self.destroy_srq_raw(srq).map(|_| ()));
        }
        for cq in live.cqs {
            self.log_destroy("CQ", cq, self.destroy_cq_raw(cq).map(|_| ()));
        }
        for mr in live.mrs {
            self.log_destroy("MR", mr, self.dereg_mr_raw(mr));
        }
        for pd in live.pds {
            self.log_destroy("PD", pd, self.dealloc_pd_raw(pd));
        }
    }

    fn log_destroy(&self, kind: &str, handle: u32, result: Result<()>) {
        if let Err(e) = result {
            // Closing the cmd fd still releases the object in the kernel.
            log::warn!("destroying {kind} {handle} at context close: {e}");
        }
    }

    fn destroy_ah_raw(&self, ah: u32) -> Result<()> {
        self.file
            .execute_no_response(&uverbs::DestroyAh { ah_handle: ah }, &[])
    }

    fn destroy_qp_raw(&self, qp: u32) -> Result<u32> {
        let req = uverbs::DestroyQp {
            qp_handle: qp,
            ..Default::default()
        };
        let (resp, ()) = self.file.execute(req, &[])?;
        Ok(resp.events_reported)
    }

    fn destroy_srq_raw(&self, srq: u32) -> Result<u32> {
        let req = uverbs::DestroySrq {
            srq_handle: srq,
            ..Default::default()
        };
        let (resp, ()) = self.file.execute(req, &[])?;
        Ok(resp.events_reported)
    }

    fn destroy_cq_raw(&self, cq: u32) -> Result<uverbs::DestroyCqResp> {
        let req = uverbs::DestroyCq {
            cq_handle: cq,
            ..Default::default()
        };
        let (resp, ()) = self.file.execute(req, &[])?;
        Ok(resp)
    }

    fn dereg_mr_raw(&self, mr: u32) -> Result<()> {
        self.file
            .execute_no_response(&uverbs::DeregMr { mr_handle: mr }, &[])
    }

    fn dealloc_pd_raw(&self, pd: u32) -> Result<()> {
        self.file
            .execute_no_response(&uverbs::DeallocPd { pd_handle: pd }, &[])
    }
}

impl Drop for RxeContext {
    fn drop(&mut self) {
        self.destroy_all();
    }
}

impl HostContext for RxeContext {
    fn queue_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    fn cmd_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    fn async_fd(&self) -> BorrowedFd<'_> {
        self.async_events.as_fd()
    }

    fn comp_channel_fd(&self) -> BorrowedFd<'_> {
        self.comp_channel.as_fd()
    }

    fn num_comp_vectors(&self) -> u32 {
        self.num_comp_vectors
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        let (resp, ()) = self.file.execute(uverbs::QueryDevice::default(), &[])?;
        Ok(device_attr(&resp))
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        let req = uverbs::QueryPort {
            port_num: port,
            ..Default::default()
        };
        let (resp, ()) = self.file.execute(req, &[])?;
        Ok(port_attr(&resp))
    }

    fn alloc_pd(&self) -> Result<PdHandle> {
        let (resp, ()) = self.file.execute(uverbs::AllocPd::default(), &[])?;
        self.live().pds.insert(resp.pd_handle);
        Ok(PdHandle(resp.pd_handle))
    }

    fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        self.dealloc_pd_raw(pd.0)?;
        self.live().pds.remove(&pd.0);
        Ok(())
    }

    fn reg_mr(&self, init: &MrInit) -> Result<Mr> {
        let req = uverbs::RegMr {
            response: 0,
            start: init.start,
            length: init.length,
            hca_va: init.iova,
            pd_handle: init.pd.0,
            access_flags: init.access.bits(),
        };
        let (resp, ()) = self.file.execute(req, &[])?;
        self.live().mrs.insert(resp.mr_handle);
        Ok(Mr {
            handle: MrHandle(resp.mr_handle),
            lkey: resp.lkey,
            rkey: resp.rkey,
        })
    }

    fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        self.dereg_mr_raw(mr.0)?;
        self.live().mrs.remove(&mr.0);
        Ok(())
    }

    fn create_cq(&self, init: &CqInit) -> Result<Cq> {
        let req = uverbs::CreateCq {
            response: 0,
            user_handle: init.user_handle,
            cqe: init.cqe,
            comp_vector: init.comp_vector,
            comp_channel: if init.use_comp_channel {
                self.comp_channel.as_fd().as_raw_fd()
            } else {
                -1
            },
            reserved: 0,
        };
        let (resp, drv): (_, RxeCreateCqResp) = self.file.execute(req, &[])?;
        self.live().cqs.insert(resp.cq_handle);
        let buffer = queue_buffer("CREATE_CQ", &drv.mi).inspect_err(|_| {
            self.log_destroy(
                "CQ",
                resp.cq_handle,
                self.destroy_cq(CqHandle(resp.cq_handle)),
            );
        })?;
        Ok(Cq {
            handle: CqHandle(resp.cq_handle),
            cqe: resp.cqe,
            buffer,
        })
    }

    fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        self.destroy_cq_raw(cq.0)?;
        self.live().cqs.remove(&cq.0);
        Ok(())
    }

    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        let req = uverbs::ReqNotifyCq {
            cq_handle: cq.0,
            solicited_only: u32::from(solicited_only),
        };
        self.file.execute_no_response(&req, &[])
    }

    fn create_qp(&self, init: &QpInit) -> Result<Qp> {
        let req = uverbs::CreateQp {
            response: 0,
            user_handle: init.user_handle,
            pd_handle: init.pd.0,
            send_cq_handle: init.send_cq.0,
            recv_cq_handle: init.recv_cq.0,
            srq_handle: init.srq.map_or(0, |s| s.0),
            max_send_wr: init.caps.max_send_wr,
            max_recv_wr: init.caps.max_recv_wr,
            max_send_sge: init.caps.max_send_sge,
            max_recv_sge: init.caps.max_recv_sge,
            max_inline_data: init.caps.max_inline_data,
            sq_sig_all: u8::from(init.sq_sig_all),
            qp_type: init.qp_type as u8,
            is_srq: u8::from(init.srq.is_some()),
            reserved: 0,
        };
        let (resp, drv): (_, RxeCreateQpResp) = self.file.execute(req, &[])?;
        self.live().qps.insert(resp.qp_handle);
        let buffers = queue_buffer("CREATE_QP", &drv.sq_mi).and_then(|sq| {
            let rq = match init.srq {
                Some(_) => None,
                None => Some(queue_buffer("CREATE_QP", &drv.rq_mi)?),
            };
            Ok((sq, rq))
        });
        let (sq, rq) = buffers.inspect_err(|_| {
            self.log_destroy(
                "QP",
                resp.qp_handle,
                self.destroy_qp(QpHandle(resp.qp_handle)),
            );
        })?;
        Ok(Qp {
            handle: QpHandle(resp.qp_handle),
            qpn: resp.qpn,
            caps: QpCaps {
                max_send_wr: resp.max_send_wr,
                max_recv_wr: resp.max_recv_wr,
                max_send_sge: resp.max_send_sge,
                max_recv_sge: resp.max_recv_sge,
                max_inline_data: resp.max_inline_data,
            },
            sq,
            rq,
        })
    }

    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        if mask.bits() & !QpAttrMask::LEGACY_ALL.bits() != 0 {
            return Err(DeviceError::Command {
                command: "MODIFY_QP",
                errno: libc::EOPNOTSUPP,
            });
        }
        self.file
            .execute_no_response(&encode_modify_qp(qp, attr, mask), &[])
    }

    fn query_qp(&self, qp: QpHandle, mask: QpAttrMask) -> Result<QpInfo> {
        let req = uverbs::QueryQp {
            response: 0,
            qp_handle: qp.0,
            attr_mask: mask.bits(),
        };
        let (resp, ()) = self.file.execute(req, &[])?;
        decode_query_qp(&resp)
    }

    fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        self.destroy_qp_raw(qp.0)?;
        self.live().qps.remove(&qp.0);
        Ok(())
    }

    fn create_srq(&self, init: &SrqInit) -> Result<Srq> {
        let req = uverbs::CreateSrq {
            response: 0,
            user_handle: init.user_handle,
            pd_handle: init.pd.0,
            max_wr: init.max_wr,
            max_sge: init.max_sge,
            srq_limit: init.srq_limit,
        };
        let (resp, drv): (_, RxeCreateSrqResp) = self.file.execute(req, &[])?;
        self.live().srqs.insert(resp.srq_handle);
        let buffer = queue_buffer("CREATE_SRQ", &drv.mi).inspect_err(|_| {
            self.log_destroy(
                "SRQ",
                resp.srq_handle,
                self.destroy_srq(SrqHandle(resp.srq_handle)),
            );
        })?;
        Ok(Srq {
            handle: SrqHandle(resp.srq_handle),
            max_wr: resp.max_wr,
            max_sge: resp.max_sge,
            srq_num: drv.srq_num,
            buffer,
        })
    }

    fn modify_srq(&self, srq: SrqHandle, modify: &SrqModify) -> Result<Option<QueueBuffer>> {
        let mut req = uverbs::ModifySrq {
            srq_handle: srq.0,
            ..Default::default()
        };
        if let Some(max_wr) = modify.max_wr {
            req.attr_mask |= SRQ_MAX_WR;
            req.max_wr = max_wr;
        }
        if let Some(limit) = modify.srq_limit {
            req.attr_mask |= SRQ_LIMIT;
            req.srq_limit = limit;
        }
        // rxe always reads `rxe_modify_srq_cmd`; a resize writes the new buffer's mminfo to the
        // address it names (as rdma-core's rxe_modify_srq passes it).
        let mut mi = MmInfo::default();
        let driver = RxeModifySrqCmd {
            mmap_info_addr: std::ptr::addr_of_mut!(mi) as u64,
        };
        self.file.execute_no_response(&req, driver.as_bytes())?;
        if modify.max_wr.is_some() {
            return queue_buffer("MODIFY_SRQ", &mi).map(Some);
        }
        Ok(None)
    }

    fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        self.destroy_srq_raw(srq.0)?;
        self.live().srqs.remove(&srq.0);
        Ok(())
    }

    fn create_ah(&self, init: &AhInit) -> Result<Ah> {
        let a = &init.attr;
        let req = uverbs::CreateAh {
            response: 0,
            user_handle: init.user_handle,
            pd_handle: init.pd.0,
            reserved: 0,
            attr: uverbs::AhAttr {
                grh: uverbs::GlobalRoute {
                    dgid: a.dgid,
                    flow_label: a.flow_label,
                    sgid_index: a.sgid_index,
                    hop_limit: a.hop_limit,
                    traffic_class: a.traffic_class,
                    reserved: 0,
                },
                dlid: a.dlid,
                sl: a.sl,
                src_path_bits: a.src_path_bits,
                static_rate: a.static_rate,
                is_global: u8::from(a.is_global),
                port_num: a.port_num,
                reserved: 0,
            },
        };
        let (resp, drv): (_, RxeCreateAhResp) = self.file.execute(req, &[])?;
        self.live().ahs.insert(resp.ah_handle);
        if drv.ah_num == 0 {
            // Kernels before 5.10 want the whole AV in each UD WQE; ring format rxe v1 does not.
            self.log_destroy(
                "AH",
                resp.ah_handle,
                self.destroy_ah(AhHandle(resp.ah_handle)),
            );
            return Err(DeviceError::InvalidReply {
                command: "CREATE_AH",
                reason: "no ah_num (kernel too old for ring format rxe v1)".into(),
            });
        }
        Ok(Ah {
            handle: AhHandle(resp.ah_handle),
            ah_num: drv.ah_num,
        })
    }

    fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        self.destroy_ah_raw(ah.0)?;
        self.live().ahs.remove(&ah.0);
        Ok(())
    }

    fn kick_send(&self, qp: QpHandle) -> Result<()> {
        let mut resp = PostSendResp::default();
        let kick = FramedKick::new(qp.0, std::ptr::addr_of_mut!(resp) as u64);
        let buf = kick.as_bytes();
        // SAFETY: `buf` is a readable buffer of its length; the command's response address
        // points at `resp`, a live 4-byte `ib_uverbs_post_send_resp`, which is exactly what
        // out_words = 1 lets the kernel write during this call.
        let n = unsafe {
            libc::write(
                self.file.as_fd().as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(DeviceError::Command {
                command: "POST_SEND",
                errno: io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO),
            });
        }
        if n.unsigned_abs() != buf.len() {
            return Err(DeviceError::ShortWrite {
                command: "POST_SEND",
                written: n.unsigned_abs(),
                len: buf.len(),
            });
        }
        Ok(())
    }

    fn read_async_event(&self) -> Result<Option<AsyncEvent>> {
        self.async_events.read_async_event()
    }

    fn read_comp_event(&self) -> Result<Option<CompEvent>> {
        self.comp_channel.read_comp_event()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modify_qp_copies_only_masked_fields() {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: 3,
            dest_qp_num: 0x11,
            rq_psn: 0x22,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            qkey: 0x1234,
            ah_attr: AhAttr {
                dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
                is_global: true,
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        let mask = QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER;
        let cmd = encode_modify_qp(QpHandle(5), &attr, mask);
        assert_eq!(cmd.qp_handle, 5);
        assert_eq!(cmd.attr_mask, mask.bits());
        assert_eq!(cmd.qp_state, 2);
        assert_eq!(cmd.path_mtu, 3);
        assert_eq!(cmd.dest_qp_num, 0x11);
        assert_eq!(cmd.rq_psn, 0x22);
        assert_eq!(cmd.max_dest_rd_atomic, 4);
        assert_eq!(cmd.min_rnr_timer, 12);
        assert_eq!(cmd.dest.dgid, attr.ah_attr.dgid);
        assert_eq!(cmd.dest.is_global, 1);
        assert_eq!(cmd.dest.hop_limit, 64);
        assert_eq!(cmd.dest.port_num, 1);
        assert_eq!(cmd.qkey, 0, "QKEY not in mask");
        assert_eq!(cmd.alt_dest, uverbs::QpDest::default());
    }

    #[test]
    fn query_qp_with_an_unknown_state_is_an_error() {
        let resp = uverbs::QueryQpResp {
            qp_state: 42,
            ..Default::default()
        };
        assert!(matches!(
            decode_query_qp(&resp),
            Err(DeviceError::InvalidReply { .. })
        ));
        let ok = uverbs::QueryQpResp {
            qp_state: 3,
            max_send_wr: 15,
            sq_sig_all: 1,
            ..Default::default()
        };
        let info = decode_query_qp(&ok).unwrap();
        assert_eq!(info.attr.qp_state, QpState::Rts);
        assert_eq!(info.caps.max_send_wr, 15);
        assert!(info.sq_sig_all);
    }

    #[test]
    fn zero_sized_queue_buffers_are_rejected() {
        assert!(queue_buffer("X", &MmInfo::default()).is_err());
        let mi = MmInfo {
            offset: 0x1000,
            size: 8192,
            pad: 0,
        };
        assert_eq!(
            queue_buffer("X", &mi).unwrap(),
            QueueBuffer {
                offset: 0x1000,
                len: 8192
            }
        );
    }

    #[test]
    fn finding_rxe_without_rdma_subsystem_fails_cleanly() {
        let missing = Path::new("/nonexistent-vrdma-sysfs");
        let err = RxeDevice::find(missing, Path::new("/dev"), None).unwrap_err();
        assert!(matches!(err, DeviceError::NoRdmaSubsystem));
    }
}
