//! The host device implementation for Soft-RoCE (`rdma_rxe`), entirely over the uverbs write
//! ABI: rxe allocates every queue buffer in the kernel and lets user space map it once from the
//! context's cmd fd, so this layer creates queues itself and hands (fd, offset, len) onwards.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;

use parking_lot::{Mutex, MutexGuard};
use vrdma_spec::attr::qp::QpCaps;
use vrdma_spec::config::OdpCaps;
use vrdma_spec::verbs::{MwType, QpAttrMask};
use vrdma_spec::wire::{GidEntry, QpAttr};
use zerocopy::IntoBytes;

use super::cm::HostCm;
use super::device::{GidSource, HostContext, HostDevice};
use super::error::{DeviceError, Result};
use super::events::EventFd;
use super::local_addresses::HostAddresses;
use super::rxe_abi::{
    MmInfo, RxeCreateAhResp, RxeCreateCqResp, RxeCreateQpResp, RxeCreateSrqResp, RxeModifySrqCmd,
    RxeResizeCqResp,
};
use super::rxe_convert::{decode_query_qp, encode_modify_qp, kernel_ah_attr, queue_buffer};
use super::sysfs::{self, DeviceInfo};
use super::types::*;
use super::ucma::KernelCm;
use super::uverbs;
use super::verbs_file::VerbsFile;

/// GID entries one QUERY_GID_TABLE call has room for (all ports): rxe's table has 1024 slots
/// per port, of which a host uses a handful; more populated entries make the call fail and
/// the table is read from sysfs.
const GID_QUERY_CAPACITY: usize = 1024;

/// `RXE_VENDOR_ID` (drivers/infiniband/sw/rxe/rxe_param.h): what QUERY_DEVICE reports for rxe.
pub const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

/// `IB_SRQ_MAX_WR`.
const SRQ_MAX_WR: u32 = 1;
/// `IB_SRQ_LIMIT`.
const SRQ_LIMIT: u32 = 2;
/// How often a DESTROY_QP refused with EBUSY is tried again, a short sleep apart: a host kick
/// from the front-end's process (spec §5.3) holds the QP for the length of one ioctl, and the
/// kernel refuses to destroy an object a command holds.
const DESTROY_BUSY_RETRIES: u32 = 100;
const DESTROY_BUSY_PAUSE: std::time::Duration = std::time::Duration::from_micros(100);

/// An rxe device on this host.
#[derive(Debug, Clone)]
pub struct RxeDevice {
    info: DeviceInfo,
    sysfs_root: std::path::PathBuf,
    /// The kernel's connection manager (`<dev root>/infiniband/rdma_cm`).
    cm_path: std::path::PathBuf,
    /// The host's addresses, kept while the kernel announces no change.
    addresses: std::sync::Arc<HostAddresses>,
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
            cm_path: dev_root.join("infiniband/rdma_cm"),
            addresses: std::sync::Arc::new(HostAddresses::new()),
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

impl GidSource for RxeDevice {
    fn gid_table(&self, port: u8) -> Result<Vec<(u32, GidEntry)>> {
        sysfs::gid_table(&self.sysfs_root, &self.info.name, port)
    }

    fn gid_entry(&self, port: u8, index: u32) -> Result<Option<GidEntry>> {
        sysfs::gid_entry(&self.sysfs_root, &self.info.name, port, index)
    }
}

impl HostDevice for RxeDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn ring_format(&self) -> u32 {
        vrdma_spec::config::ring_format::RXE_V1
    }

    fn open_context(&self) -> Result<Box<dyn HostContext>> {
        Ok(Box::new(self.open()?))
    }

    fn delivers_locally(&self, gid: &[u8; 16]) -> Result<bool> {
        self.addresses
            .contains(gid)
            .map_err(|source| DeviceError::Io {
                what: "listing the host's addresses",
                source,
            })
    }

    fn netdev_ifindex(&self, port: u8) -> Option<u32> {
        let name = sysfs::port_netdev(&self.sysfs_root, &self.info.name, port)?;
        sysfs::netdev_ifindex(&self.sysfs_root, &name).ok()
    }

    fn open_cm(&self) -> Result<Option<Box<dyn HostCm>>> {
        match KernelCm::open(&self.cm_path) {
            Ok(cm) => Ok(Some(Box::new(cm))),
            // rdma_ucm not loaded: no connection manager to offer.
            Err(DeviceError::Open { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// Kernel objects a context holds, so that dropping it destroys them in dependency order.
#[derive(Debug, Default)]
struct LiveObjects {
    pds: BTreeSet<u32>,
    mrs: BTreeSet<u32>,
    mws: BTreeSet<u32>,
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
        // update is a single insert or remove (parking_lot's locks do not poison).
        self.live.lock()
    }

    fn destroy_all(&self) {
        let live = std::mem::take(&mut *self.live());
        // Reverse dependency order: bound MWs hold their MR and (type 2) their QP, which rxe
        // waits for when it destroys those; AHs and QPs use PDs, CQs and SRQs; MRs use PDs.
        for mw in live.mws {
            self.log_destroy("MW", mw, self.dealloc_mw_raw(mw));
        }
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

    fn dealloc_mw_raw(&self, mw: u32) -> Result<()> {
        self.file
            .execute_no_response(&uverbs::DeallocMw { mw_handle: mw }, &[])
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

/// Errors of a GID ioctl after which the caller reads sysfs instead: no such method (kernels
/// before 5.10), or EINVAL (a table larger than the buffer, an index beyond the table, or a
/// call the kernel does not understand).
const IOCTL_UNAVAILABLE: [i32; 4] = [
    libc::ENOTTY,
    libc::EOPNOTSUPP,
    libc::EPROTONOSUPPORT,
    libc::EINVAL,
];

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

    fn gid_table(&self, port: u8) -> Result<Option<Vec<(u32, GidEntry)>>> {
        match self
            .file
            .query_gid_table(uverbs::DRIVER_RXE, GID_QUERY_CAPACITY)
        {
            Ok(entries) => Ok(Some(
                entries
                    .iter()
                    .filter(|e| e.port_num == u32::from(port))
                    .filter_map(|e| Some((e.gid_index, e.to_entry()?)))
                    .collect(),
            )),
            // A kernel without the method (before 5.10), or a table larger than the buffer:
            // the caller reads sysfs.
            Err(DeviceError::Command { errno, .. }) if IOCTL_UNAVAILABLE.contains(&errno) => {
                log::debug!("GID table unreadable in one call (errno {errno}): sysfs instead");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn gid_entry(&self, port: u8, index: u32) -> Result<Option<Option<GidEntry>>> {
        match self.file.query_gid_entry(uverbs::DRIVER_RXE, port, index) {
            Ok(entry) if entry.port_num == u32::from(port) && entry.gid_index == index => {
                Ok(Some(entry.to_entry()))
            }
            Ok(entry) => Err(DeviceError::InvalidReply {
                command: "QUERY_GID_ENTRY",
                reason: format!(
                    "entry {} of port {} for entry {index} of port {port}",
                    entry.gid_index, entry.port_num
                ),
            }),
            // An empty slot.
            Err(DeviceError::Command {
                errno: libc::ENODATA,
                ..
            }) => Ok(Some(None)),
            // A kernel without the method (before 5.10), or EINVAL, which the kernel answers
            // both for an index beyond the table and for a call it does not understand: the
            // caller reads sysfs, which tells them apart.
            Err(DeviceError::Command { errno, .. }) if IOCTL_UNAVAILABLE.contains(&errno) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn comp_channel_fd(&self) -> BorrowedFd<'_> {
        self.comp_channel.as_fd()
    }

    fn num_comp_vectors(&self) -> u32 {
        self.num_comp_vectors
    }

    fn query_device(&self) -> Result<uverbs::QueryDeviceResp> {
        let (resp, ()) = self.file.execute(uverbs::QueryDevice::default(), &[])?;
        Ok(resp)
    }

    fn odp_caps(&self) -> Result<Option<OdpCaps>> {
        let caps = self.file.ex_query_device()?.odp_caps;
        Ok(
            (caps.general_caps & uverbs::ODP_SUPPORT != 0).then_some(OdpCaps {
                rc: caps.rc_odp_caps,
                uc: caps.uc_odp_caps,
                ud: caps.ud_odp_caps,
            }),
        )
    }

    /// rxe's on-demand paging takes an MR's iova for an address of the registering process: it
    /// faults in and indexes pages at `iova - umem address` (`rxe_odp.c`,
    /// `rxe_odp_map_range_and_lock` and `__rxe_odp_mr_copy`), where its other MRs translate
    /// from `ibmr.iova`. Natively the two are equal (`ibv_reg_mr`); for a guest's MR they are
    /// not, so the NIC would touch the wrong pages or none.
    fn odp_serves_any_iova(&self) -> bool {
        false
    }

    fn query_port(&self, port: u8) -> Result<uverbs::QueryPortResp> {
        let req = uverbs::QueryPort {
            port_num: port,
            ..Default::default()
        };
        let (resp, ()) = self.file.execute(req, &[])?;
        Ok(resp)
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

    fn alloc_mw(&self, pd: PdHandle, mw_type: MwType) -> Result<Mw> {
        let req = uverbs::AllocMw {
            response: 0,
            pd_handle: pd.0,
            // `MwType` holds the kernel's `IB_MW_TYPE_*` values, 1 and 2.
            mw_type: mw_type as u32 as u8,
            reserved: [0; 3],
        };
        let (resp, ()) = self.file.execute(req, &[])?;
        self.live().mws.insert(resp.mw_handle);
        Ok(Mw {
            handle: MwHandle(resp.mw_handle),
            rkey: resp.rkey,
        })
    }

    fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        self.dealloc_mw_raw(mw.0)?;
        self.live().mws.remove(&mw.0);
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

    fn resize_cq(&self, cq: CqHandle, cqe: u32) -> Result<CqResize> {
        let req = uverbs::ResizeCq {
            response: 0,
            cq_handle: cq.0,
            cqe,
        };
        // rxe answers with the new buffer's mminfo in the driver part of the response
        // (`struct rxe_resize_cq_resp`, as rdma-core's rxe_resize_cq reads it).
        let (resp, drv): (_, RxeResizeCqResp) = self.file.execute(req, &[])?;
        Ok(CqResize {
            cqe: resp.cqe,
            buffer: queue_buffer("RESIZE_CQ", &drv.mi)?,
        })
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
            // `QpType`'s values are the kernel's `ib_qp_type` ones (RC 2, UC 3, UD 4; spec's
            // tests pin them).
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
        let mut busy = 0;
        loop {
            match self.destroy_qp_raw(qp.0) {
                Err(DeviceError::Command {
                    errno: libc::EBUSY, ..
                }) if busy < DESTROY_BUSY_RETRIES => {
                    busy += 1;
                    std::thread::sleep(DESTROY_BUSY_PAUSE);
                }
                done => {
                    done?;
                    break;
                }
            }
        }
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
        let req = uverbs::CreateAh {
            response: 0,
            user_handle: init.user_handle,
            pd_handle: init.pd.0,
            reserved: 0,
            attr: kernel_ah_attr(&init.attr),
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
        self.file.kick_send(qp.0)
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
    fn finding_rxe_without_rdma_subsystem_fails_cleanly() {
        let missing = Path::new("/nonexistent-vrdma-sysfs");
        let err = RxeDevice::find(missing, Path::new("/dev"), None).unwrap_err();
        assert!(matches!(err, DeviceError::NoRdmaSubsystem));
    }
}
