//! Attacks on addressing: source GIDs that are not the guest's, forged UD address vectors,
//! AH numbers and QP numbers of others, destinations and traffic classes the policy forbids.

use vrdma::provider::rxe_v1::RxeAddressHandle;
use vrdma::verbs::{
    ConnectOptions, Context, Gid, Qp, QpAttr, QpAttrMask, QpState, QpType, RemoteQp, SendFlags,
    SendWr, UdDest, WcStatus, WrOpcode,
};

use vrdma::spec::Status;

use super::setup::{ah_attr, Kit, Result, SetupError, PORT, QKEY};
use super::{Outcome, Targets};

/// Source GID indices tried past the guest's own entries.
const FOREIGN_INDICES: u32 = 4;
/// AH numbers a guest might guess (rxe numbers AHs from 1).
const GUESSED_AH_NUMS: std::ops::RangeInclusive<u32> = 1..=8;
/// Byte offset of the IPv6 address in the `sockaddr_in6` of `rxe_av.sgid_addr`.
const SIN6_ADDR: usize = 8;

/// Indices of the GID table that are not the guest's (its own are `0..own_gids`).
fn foreign_indices(kit: &Kit) -> impl Iterator<Item = u8> {
    (kit.own_gids..kit.own_gids + FOREIGN_INDICES).filter_map(|i| u8::try_from(i).ok())
}

fn self_remote(kit: &Kit, qp: &Qp) -> RemoteQp {
    RemoteQp {
        qpn: qp.qpn(),
        psn: 0,
        gid: kit.gid,
        lid: 0,
    }
}

pub(super) fn sgid_av(kit: &Kit, out: &mut Outcome) -> Result<()> {
    for index in foreign_indices(kit) {
        let qp = kit.qp(QpType::Rc)?;
        qp.to_init(PORT, ConnectOptions::default().access)?;
        let opts = ConnectOptions {
            sgid_index: index,
            ..ConnectOptions::default()
        };
        out.attempt(
            format!("RTR from sgid_index {index}"),
            qp.to_rtr(&self_remote(kit, &qp), &opts),
        );
    }
    let qp = kit.qp(QpType::Rc)?;
    let remote = self_remote(kit, &qp);
    out.control(
        "connecting from the guest's own GID 0",
        qp.connect(&remote, &ConnectOptions::default()),
    );
    Ok(())
}

pub(super) fn sgid_alt_path(kit: &Kit, out: &mut Outcome) -> Result<()> {
    let qp = kit.qp(QpType::Rc)?;
    let remote = self_remote(kit, &qp);
    qp.connect(&remote, &ConnectOptions::default())?;
    let alt = |sgid_index: u8| {
        QpAttr::default()
            .with_qp_state(QpState::Rts)
            .with_alt_ah_attr(ah_attr(kit.gid, sgid_index, 0))
            .with_alt_port_num(PORT)
            .with_alt_timeout(14)
    };
    let mask = QpAttrMask::STATE | QpAttrMask::ALT_PATH;
    for index in foreign_indices(kit) {
        out.attempt(
            format!("alternate path from sgid_index {index}"),
            qp.modify(&alt(index), mask),
        );
    }
    // Linux refuses alternate paths on RoCE ports (the core handles APM only for InfiniBand):
    // the legitimate alternate path passes the device's checks and is refused by the host
    // (DEVICE_ERROR), where the foreign ones never got past the device.
    match qp.modify(&alt(0), mask) {
        Ok(()) => out.controls_passed += 1,
        Err(e) if e.status() == Some(Status::DeviceError) => {
            out.controls_passed += 1;
            out.notes
                .push("the host refused the legitimate alternate path (RoCE has no APM)".into());
        }
        Err(e) => out
            .controls_failed
            .push(format!("alternate path from the guest's own GID 0: {e}")),
    }
    Ok(())
}

pub(super) fn sgid_ah(kit: &Kit, out: &mut Outcome) -> Result<()> {
    for index in foreign_indices(kit) {
        out.attempt(
            format!("CREATE_AH from sgid_index {index}"),
            kit.ah(kit.gid, index, 0),
        );
    }
    out.control("CREATE_AH from GID 0", kit.ah(kit.gid, 0, 0));
    Ok(())
}

/// Posts one UD send of 64 bytes to `dest` on a fresh UD QP and reports whether it completed
/// successfully (`Ok(true)`), with an error (`Ok(false)`), or not at all.
fn ud_send(kit: &Kit, ah: &RxeAddressHandle, remote_qpn: u32) -> Result<bool> {
    let qp = kit.ud_qp()?;
    kit.drain();
    let sge = [kit.sge(4096, 64)];
    let wr = SendWr {
        wr_id: 0xa77ac,
        opcode: WrOpcode::Send,
        flags: SendFlags::SIGNALED,
        sg_list: &sge,
        ud: Some(UdDest {
            ah,
            remote_qpn,
            remote_qkey: QKEY,
        }),
        ..SendWr::default()
    };
    // SAFETY: no inline data; the SGE lies in the kit's registered buffer, which outlives the
    // request (its completion is awaited below).
    unsafe { qp.post_send(&[wr]) }.map_err(|e| SetupError::Post(e.to_string()))?;
    loop {
        let wc = kit
            .next_completion()
            .ok_or_else(|| SetupError::Post("no completion for a UD send".into()))?;
        if wc.wr_id == 0xa77ac {
            return Ok(wc.status == WcStatus::Success);
        }
    }
}

/// Records a UD send attempt that must not have completed successfully.
fn ud_attempt(out: &mut Outcome, what: String, sent: Result<bool>) -> Result<()> {
    out.attempts += 1;
    match sent? {
        true => out.accepted.push(what),
        false => out.refused_as("error completion".into()),
    }
    Ok(())
}

/// A legitimate UD send to the guest's own second QP, which must arrive.
fn ud_control(kit: &Kit, out: &mut Outcome) -> Result<()> {
    let receiver = kit.ud_qp()?;
    let ah = kit.ah(kit.gid, 0, 0)?;
    let sent = ud_send(kit, ah.rxe(), receiver.qpn())?;
    let received = kit
        .drain()
        .iter()
        .any(|wc| wc.qp_num == receiver.qpn() && wc.status == WcStatus::Success);
    if sent {
        out.controls_passed += 1;
    } else {
        out.controls_failed
            .push("a UD send through the guest's own AH failed".into());
    }
    if !received {
        out.notes
            .push("the control UD message was not yet received when checked".into());
    }
    Ok(())
}

pub(super) fn forged_ud_av(kit: &Kit, out: &mut Outcome) -> Result<()> {
    let receiver = kit.ud_qp()?;
    let real = kit.ah(kit.gid, 0, 0)?;
    // The guest's own address vector with another source: the first host GID it cannot use,
    // or a made-up link-local one.
    for forged_source in [
        [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xde, 0xad, 0, 1],
        [0; 16],
    ] {
        let mut av = real.rxe().av;
        av.sgid_addr[SIN6_ADDR..SIN6_ADDR + 16].copy_from_slice(&forged_source);
        let forged = RxeAddressHandle { ah_num: 0, av };
        let sent = ud_send(kit, &forged, receiver.qpn());
        ud_attempt(
            out,
            format!("UD send with ah_num 0 and source {forged_source:02x?}"),
            sent,
        )?;
    }
    ud_control(kit, out)
}

pub(super) fn foreign_ah_num(kit: &Kit, out: &mut Outcome) -> Result<()> {
    let receiver = kit.ud_qp()?;
    let real = kit.ah(kit.gid, 0, 0)?;
    for ah_num in GUESSED_AH_NUMS.filter(|n| *n != real.rxe().ah_num) {
        let guessed = RxeAddressHandle {
            ah_num,
            av: real.rxe().av,
        };
        let sent = ud_send(kit, &guessed, receiver.qpn());
        ud_attempt(out, format!("UD send naming ah_num {ah_num}"), sent)?;
    }
    ud_control(kit, out)
}

/// The victim guest's kit, from `--victim-socket`.
fn victim(targets: &Targets) -> Result<Kit> {
    let socket = targets
        .victim_socket
        .as_ref()
        .ok_or_else(|| SetupError::Post("this attack needs --victim-socket".into()))?;
    let ctx = Context::connect_process(socket)?;
    Kit::new(&ctx)
}

pub(super) fn foreign_qpn_rc(kit: &Kit, targets: &Targets, out: &mut Outcome) -> Result<()> {
    let victim = victim(targets)?;
    let victim_qp = victim.qp(QpType::Rc)?;
    victim_qp.to_init(PORT, ConnectOptions::default().access)?;
    let qp = kit.qp(QpType::Rc)?;
    // The victim's QP number, reached through the attacker's own address.
    let through_own = RemoteQp {
        qpn: victim_qp.qpn(),
        ..self_remote(kit, &qp)
    };
    out.attempt(
        format!(
            "RC connect to the other guest's QP {:#x} at the attacker's address",
            victim_qp.qpn()
        ),
        qp.connect(&through_own, &ConnectOptions::default()),
    );
    let own = kit.qp(QpType::Rc)?;
    let remote = self_remote(kit, &own);
    out.control(
        "RC connect to the attacker's own QP",
        own.connect(&remote, &ConnectOptions::default()),
    );
    Ok(())
}

pub(super) fn foreign_qpn_ud(kit: &Kit, targets: &Targets, out: &mut Outcome) -> Result<()> {
    let victim = victim(targets)?;
    let victim_qp = victim.ud_qp()?;
    let own = kit.ah(kit.gid, 0, 0)?;
    let sent = ud_send(kit, own.rxe(), victim_qp.qpn());
    ud_attempt(
        out,
        format!(
            "UD send to the other guest's QP {:#x} at the attacker's address",
            victim_qp.qpn()
        ),
        sent,
    )?;
    if let Some(wc) = victim.drain().first() {
        out.accepted.push(format!(
            "the other guest's QP received a message (status {:?}, {} bytes)",
            wc.status, wc.byte_len
        ));
    }
    // The host's GSI (QP 1) at the attacker's own address: the host's one connection manager
    // serves every tenant, and a tenant's CM runs through the device, never by MADs of its own.
    let gsi = ud_send(kit, own.rxe(), 1);
    ud_attempt(
        out,
        "UD send to QP 1 (the host's GSI) at the attacker's address".into(),
        gsi,
    )?;
    ud_control(kit, out)
}

pub(super) fn forbidden_peer(kit: &Kit, targets: &Targets, out: &mut Outcome) -> Result<()> {
    let peer = Gid(targets
        .forbidden_peer
        .ok_or_else(|| SetupError::Post("this attack needs --forbidden-peer".into()))?);
    let qp = kit.qp(QpType::Rc)?;
    qp.to_init(PORT, ConnectOptions::default().access)?;
    let remote = RemoteQp {
        gid: peer,
        ..self_remote(kit, &qp)
    };
    out.attempt(
        "RTR to a forbidden destination",
        qp.to_rtr(&remote, &ConnectOptions::default()),
    );
    out.attempt("CREATE_AH to a forbidden destination", kit.ah(peer, 0, 0));
    out.control("CREATE_AH to the guest itself", kit.ah(kit.gid, 0, 0));
    Ok(())
}

pub(super) fn traffic_class(kit: &Kit, targets: &Targets, out: &mut Outcome) -> Result<()> {
    let qp = kit.qp(QpType::Rc)?;
    qp.to_init(PORT, ConnectOptions::default().access)?;
    let opts = ConnectOptions {
        traffic_class: targets.bad_traffic_class,
        ..ConnectOptions::default()
    };
    out.attempt(
        format!("RTR with traffic class {}", targets.bad_traffic_class),
        qp.to_rtr(&self_remote(kit, &qp), &opts),
    );
    out.attempt(
        format!("CREATE_AH with traffic class {}", targets.bad_traffic_class),
        kit.ah(kit.gid, 0, targets.bad_traffic_class),
    );
    out.control("CREATE_AH with traffic class 0", kit.ah(kit.gid, 0, 0));
    Ok(())
}
