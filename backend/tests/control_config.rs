//! Configuration space, features and QUERY_* of the per-guest device, and the checks of the
//! daemon's options.
//!
//! The real per-guest device (`GuestDevice`) driven through the `DeviceHandler` API on a host
//! without RDMA, over the fake host device and fake frontend of `vrdma_test_support::fake_host`.

use std::process::Command;

use vrdma_backend::guest::options::DeviceOptions;
use vrdma_backend::guest_device::GuestDeviceFactory;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::config::ring_format;
use vrdma_spec::features::*;
use vrdma_spec::wire::*;
use vrdma_spec::{ControlRequest, Le16, Le32, Le64, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;
use zerocopy::{FromZeros, IntoBytes};

#[test]
fn configuration_space_and_features() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let dev = guest.dev();
    assert_eq!(
        dev.device_features(),
        VRDMA_F_RING_RXE_V1
            | VRDMA_F_SRQ
            | VRDMA_F_UC
            | VRDMA_F_MR_EXTENTS
            | VRDMA_F_STAGED_RINGS
            | VRDMA_F_STAGED_CQS
            | VRDMA_F_HOST_KICK
            | VRDMA_F_ODP
    );
    let config = guest.config();
    assert_eq!(config.ring_format.get(), ring_format::RXE_V1);
    assert_eq!(config.num_ports.get(), 1);
    assert_eq!(config.shm_size.get(), SHM_SIZE);
    assert_eq!(config.shm_page_shift.get(), 12);
    assert_eq!(config.doorbell_slots.get(), 4, "QP quota 3 rounded up");
    assert_eq!(config.max_mr_pages.get(), 64);
    // A REREG_MR body (40 bytes) is larger than a REG_MR body (32): both take 64 pages.
    assert_eq!(config.max_request_size.get(), 8 + 40 + 8 * 64);
    assert_eq!(config.max_response_size.get(), 200);
    assert_eq!(dev.shmem_size(), SHM_SIZE);
    // The completion channel, async events, the staging retry timer (the fake has no CM).
    assert_eq!(dev.watched_fds().len(), 3);

    // A driver without a ring format sees format 0 and cannot create queues.
    dev.features_acked(VIRTIO_F_VERSION_1);
    assert_eq!(guest.config().ring_format.get(), ring_format::NONE);
    let cq = CreateCqReq {
        cqe: Le32::new(8),
        reserved: Le32::ZERO,
    };
    assert_eq!(
        guest.status(ControlRequest::CreateCq(cq)),
        Status::Unsupported
    );
    // A driver that did not accept VERSION_1 gets nothing done.
    dev.features_acked(ALL_FEATURES);
    assert_eq!(guest.status(ControlRequest::AllocPd), Status::Unsupported);
    assert_eq!(fake.world().live(), 0);

    let ud = DeviceOptions {
        allow_ud: true,
        ..test_options()
    };
    let guest = TestGuest::new(&fake, ud, ALL_FEATURES);
    assert_eq!(guest.dev().device_features(), ALL_FEATURES);
}

#[test]
fn queries() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    let ResponseBody::QueryDevice(attr) = guest.ok(ControlRequest::QueryDevice) else {
        panic!()
    };
    assert_eq!(attr.max_qp.get(), 3, "capped by the quota");
    assert_eq!(attr.max_pd.get(), 4);
    assert_eq!(attr.max_srq.get(), 0, "SRQ not negotiated");
    assert_eq!(attr.max_ah.get(), 0, "UD not negotiated");
    assert_eq!(attr.max_mr_bytes.get(), 64 * PAGE);
    assert_eq!(attr.max_mr_size.get(), 64 * PAGE);
    assert_eq!(attr.max_inline_data.get(), 32 * 16);
    assert_eq!(attr.phys_port_cnt, 1);
    assert_eq!(&attr.fw_ver[..6], b"1.2.3\0");
    assert_eq!(
        attr.device_cap_flags.get() & (1 << 17),
        0,
        "no memory windows"
    );

    let port = |n| QueryPortReq {
        port_num: Le32::new(n),
        reserved: Le32::ZERO,
    };
    let ResponseBody::QueryPort(p) = guest.ok(ControlRequest::QueryPort(port(1))) else {
        panic!()
    };
    assert_eq!(
        (p.state.get(), p.gid_tbl_len.get(), p.link_layer),
        (4, 16, 2)
    );
    assert_eq!(
        guest.status(ControlRequest::QueryPort(port(2))),
        Status::Invalid
    );
    assert_eq!(
        guest.status(ControlRequest::QueryPort(port(0))),
        Status::Invalid
    );

    let table = |port, index| QueryTableReq {
        port_num: Le32::new(port),
        index: Le32::new(index),
    };
    let ResponseBody::QueryGid(g) = guest.ok(ControlRequest::QueryGid(table(1, 0))) else {
        panic!()
    };
    assert_eq!(
        (g.gid, g.gid_type.get(), g.flags.get()),
        (GID0, 2, GID_FLAG_VALID)
    );
    let ResponseBody::QueryGid(g) = guest.ok(ControlRequest::QueryGid(table(1, 5))) else {
        panic!()
    };
    assert_eq!(
        (g.gid, g.flags.get()),
        ([0; 16], 0),
        "empty entry, not an error"
    );
    assert_eq!(
        guest.status(ControlRequest::QueryGid(table(1, 16))),
        Status::Invalid
    );
    assert_eq!(
        guest.status(ControlRequest::QueryGid(table(2, 0))),
        Status::Invalid
    );
    let ResponseBody::QueryPkey(k) = guest.ok(ControlRequest::QueryPkey(table(1, 0))) else {
        panic!()
    };
    assert_eq!(k.pkey.get(), 0xffff);
    assert_eq!(
        guest.status(ControlRequest::QueryPkey(table(1, 1))),
        Status::Invalid
    );
}

/// Every byte of the QUERY_DEVICE, QUERY_PORT and QUERY_GID answers, from the fake host's
/// attributes and the test quotas (SRQ and UD negotiated, so no count is zeroed).
#[test]
fn query_answers_are_byte_exact() {
    let fake = FakeDevice::new();
    let options = DeviceOptions {
        allow_ud: true,
        ..test_options()
    };
    let guest = TestGuest::new(&fake, options, ALL_FEATURES);
    let ResponseBody::QueryDevice(attr) = guest.ok(ControlRequest::QueryDevice) else {
        panic!()
    };
    let mut fw_ver = [0u8; 64];
    fw_ver[..5].copy_from_slice(b"1.2.3");
    let n = Le32::new;
    let expected = DeviceAttr {
        fw_ver,
        node_guid: [0; 8],
        sys_image_guid: [0; 8],
        max_mr_size: Le64::new(64 * PAGE),
        page_size_cap: Le64::new(0xffff_f000),
        max_mr_bytes: Le64::new(64 * PAGE),
        vendor_id: n(0xff_ffff),
        vendor_part_id: n(0),
        hw_ver: n(0),
        device_cap_flags: n(0x7c86),
        max_qp: n(3),
        // The host's 2^14, capped so a queue at the limit takes at most a quarter of the
        // test's 1 MiB queue region (1 KiB send slots; 512 B receive slots for the SRQ).
        max_qp_wr: n(127),
        max_sge: n(32),
        max_sge_rd: n(32),
        max_cq: n(4),
        max_cqe: n(1 << 15),
        max_mr: n(4),
        max_pd: n(4),
        max_qp_rd_atom: n(128),
        max_qp_init_rd_atom: n(128),
        max_res_rd_atom: n(1 << 16),
        atomic_cap: n(0),
        max_ah: n(2),
        max_srq: n(2),
        max_srq_wr: n(255),
        max_srq_sge: n(27),
        max_inline_data: n(32 * 16),
        max_pkeys: Le16::new(64),
        local_ca_ack_delay: 0,
        phys_port_cnt: 1,
    };
    assert_eq!(attr, expected);

    let ResponseBody::QueryPort(port) = guest.ok(ControlRequest::QueryPort(QueryPortReq {
        port_num: Le32::new(1),
        reserved: Le32::ZERO,
    })) else {
        panic!()
    };
    let mut expected = PortAttr::new_zeroed();
    expected.state = n(4);
    expected.max_mtu = n(5);
    expected.active_mtu = n(3);
    expected.gid_tbl_len = n(16);
    expected.pkey_tbl_len = Le16::new(1);
    expected.link_layer = 2;
    assert_eq!(port, expected);

    let gid = |index| {
        let req = ControlRequest::QueryGid(QueryTableReq {
            port_num: Le32::new(1),
            index: Le32::new(index),
        });
        let ResponseBody::QueryGid(entry) = guest.ok(req) else {
            panic!()
        };
        entry
    };
    let mut valid = [0u8; 24];
    valid[..16].copy_from_slice(&GID0);
    valid[16] = 2; // RoCE v2
    valid[20] = 1; // VALID
    assert_eq!(gid(0).as_bytes(), valid);
    assert_eq!(gid(5).as_bytes(), [0; 24], "an empty entry is all zeroes");
}

#[test]
fn factory_options_are_validated() {
    let fake = FakeDevice::new();
    let bad = |options: DeviceOptions| GuestDeviceFactory::new(fake.clone(), options).is_err();
    assert!(bad(DeviceOptions {
        shm_size: 3 * PAGE,
        ..test_options()
    }));
    assert!(bad(DeviceOptions {
        host_port: 2,
        ..test_options()
    }));
    assert!(bad(DeviceOptions {
        max_mr_pages: 0,
        ..test_options()
    }));
    let mut too_many = test_options();
    too_many.quotas.qps = (1 << 16) + 1;
    assert!(bad(too_many));
}

#[test]
fn the_daemon_reports_a_missing_rdma_stack_in_one_line() {
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_vrdma-backend"))
            .args(args)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(!output.status.success(), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("vrdma-backend: "), "{stderr}");
        stderr
    };
    let socket = std::env::temp_dir().join(format!("vrdma-cli-{}.sock", std::process::id()));
    let socket = socket.to_str().unwrap();
    let missing = run(&["--socket", socket, "--device", "no-such-rdma-device"]);
    if std::path::Path::new("/sys/class/infiniband").exists() {
        assert!(missing.contains("no RDMA device named"), "{missing}");
    } else {
        assert!(
            missing.contains("no RDMA subsystem in this kernel"),
            "{missing}"
        );
        let default = run(&["--socket", socket]);
        assert!(
            default.contains("no RDMA subsystem in this kernel"),
            "{default}"
        );
    }
    let bad_size = run(&["--socket", socket, "--shm-size", "12345"]);
    assert!(bad_size.contains("queue region size"), "{bad_size}");
    assert!(!std::path::Path::new(socket).exists());
}
