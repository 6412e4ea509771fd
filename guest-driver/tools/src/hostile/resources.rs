//! Attacks on the daemon's shared resources: page lists that cost one mapping per page, pinned
//! memory beyond the budget, staged queues (each a mapping in the daemon), and malformed
//! commands meant to flood its log.

use vrdma::spec::control::{
    encode_page_list, ControlRequest, ControlResponse, Opcode, RegMr, ResponseBody, HEADER_SIZE,
    MAX_RESPONSE_SIZE,
};
use vrdma::spec::wire::{HandleReq, RegMrReq};
use vrdma::spec::{Le32, Le64};
use vrdma::verbs::{AccessFlags, Context, Mr, QpType};

use super::setup::{Kit, Result, SetupError};
use super::{Outcome, Targets};

/// Bytes of a page of the page lists (the guest's DMA pages).
const PAGE: usize = 4096;
/// Stop registering after this many MRs even if nothing refused one (a budget that large is
/// a finding of its own, reported as an accepted attempt).
const MAX_PIN_MRS: usize = 4096;

/// Sends `request` as the raw bytes a driver would, returning the response's status name on
/// failure and the body on success.
fn raw(ctx: &Context, request: &ControlRequest<'_>) -> std::result::Result<ResponseBody, String> {
    let mut bytes = Vec::new();
    request.encode_into(&mut bytes);
    raw_bytes(ctx, request.opcode(), &bytes)
}

fn raw_bytes(
    ctx: &Context,
    opcode: Opcode,
    bytes: &[u8],
) -> std::result::Result<ResponseBody, String> {
    let mut response = vec![0u8; HEADER_SIZE + MAX_RESPONSE_SIZE];
    let used = ctx
        .transport()
        .round_trip(bytes, &mut response)
        .map_err(|e| format!("transport: {e}"))?;
    match ControlResponse::decode(opcode, &response[..used.min(response.len())]) {
        Ok(ControlResponse::Ok(body)) => Ok(body),
        Ok(ControlResponse::Err(status)) => Err(format!("{:?}", status.status())),
        Err(e) => Err(format!("undecodable response: {e}")),
    }
}

impl Outcome {
    fn attempt_raw(&mut self, what: String, result: std::result::Result<ResponseBody, String>) {
        self.attempts += 1;
        match result {
            Ok(_) => self.accepted.push(what),
            Err(status) => self.refused_as(status),
        }
    }
}

/// A REG_MR of `pages` (guest-physical page addresses) over the kit's PD.
fn reg_mr(kit: &Kit, pages: &[u64]) -> std::result::Result<ResponseBody, String> {
    let mut list = Vec::with_capacity(pages.len() * 8);
    encode_page_list(pages.iter().copied(), &mut list);
    let req = RegMrReq {
        pd: Le32::new(kit.pd.handle()),
        access: Le32::new(AccessFlags::LOCAL_WRITE.bits()),
        iova: Le64::new(0x1000_0000),
        length: Le64::new((pages.len() * PAGE) as u64),
        page_shift: Le32::new(PAGE.trailing_zeros()),
        npages: Le32::new(pages.len() as u32),
    };
    let result = raw(&kit.ctx, &ControlRequest::RegMr(RegMr::new(req, &list)));
    if let Ok(ResponseBody::RegMr(resp)) = &result {
        // Leave nothing behind: the attack is the registration, not the MR.
        let dereg = ControlRequest::DeregMr(HandleReq {
            handle: resp.mr,
            reserved: Le32::ZERO,
        });
        let _ = raw(&kit.ctx, &dereg);
    }
    result
}

/// Guest-physical addresses of the pages of a fresh buffer of `pages` pages.
fn page_addresses(kit: &Kit, pages: usize) -> Result<(vrdma::dma::DmaBuffer, Vec<u64>)> {
    let buffer = kit.ctx.alloc_buffer(pages * PAGE)?;
    let addresses = kit
        .ctx
        .transport()
        .dma()
        .translate(buffer.as_ptr(), buffer.len())
        .map_err(|e| SetupError::Post(format!("translating the buffer: {e}")))?;
    Ok((buffer, addresses))
}

pub(super) fn scattered_pages(kit: &Kit, targets: &Targets, out: &mut Outcome) -> Result<()> {
    let pages = targets.pages as usize;
    let (_buffer, addresses) = page_addresses(kit, pages * 2)?;
    let every_other: Vec<u64> = addresses.iter().copied().step_by(2).collect();
    out.attempt_raw(
        format!("REG_MR of {} scattered pages", every_other.len()),
        reg_mr(kit, &every_other),
    );
    let contiguous = &addresses[..pages.min(addresses.len())];
    match reg_mr(kit, contiguous) {
        Ok(_) => out.controls_passed += 1,
        Err(status) => out.controls_failed.push(format!(
            "REG_MR of {} contiguous pages: {status}",
            contiguous.len()
        )),
    }
    Ok(())
}

pub(super) fn repeated_pages(kit: &Kit, targets: &Targets, out: &mut Outcome) -> Result<()> {
    let (_buffer, addresses) = page_addresses(kit, 1)?;
    let repeated = vec![addresses[0]; targets.pages as usize];
    out.attempt_raw(
        format!("REG_MR naming one page {} times", repeated.len()),
        reg_mr(kit, &repeated),
    );
    match reg_mr(kit, &addresses) {
        Ok(_) => out.controls_passed += 1,
        Err(status) => out
            .controls_failed
            .push(format!("REG_MR of the page once: {status}")),
    }
    Ok(())
}

pub(super) fn pin_budget(kit: &Kit, targets: &Targets, out: &mut Outcome) -> Result<()> {
    let mut held: Vec<Mr<'static>> = Vec::new();
    loop {
        if held.len() >= MAX_PIN_MRS {
            out.attempts += 1;
            out.accepted.push(format!(
                "{} MRs of {} bytes registered without refusal",
                held.len(),
                targets.pin_chunk
            ));
            break;
        }
        let buffer = match kit.ctx.alloc_buffer(targets.pin_chunk) {
            Ok(buffer) => buffer,
            Err(e) => {
                out.notes.push(format!(
                    "guest memory ran out after {} MRs: {e}",
                    held.len()
                ));
                break;
            }
        };
        match kit.pd.register_owned(buffer, AccessFlags::LOCAL_WRITE) {
            Ok(mr) => held.push(mr),
            Err(e) => {
                out.attempt(format!("MR number {}", held.len() + 1), Err::<(), _>(e));
                out.notes.push(format!(
                    "refused after {} MRs, {} bytes pinned",
                    held.len(),
                    held.len() * targets.pin_chunk
                ));
                break;
            }
        }
    }
    let registered = held.len();
    held.clear();
    // Everything released: the budget is whole again.
    out.control(
        format!("registering again after releasing {registered} MRs"),
        kit.ctx
            .alloc_buffer(targets.pin_chunk)
            .and_then(|buffer| kit.pd.register_owned(buffer, AccessFlags::LOCAL_WRITE)),
    );
    Ok(())
}

pub(super) fn staged_queues(kit: &Kit, targets: &Targets, out: &mut Outcome) -> Result<()> {
    let mut held = Vec::new();
    loop {
        if held.len() >= targets.queue_bound as usize {
            out.attempts += 1;
            out.accepted
                .push(format!("{} UD QPs created without refusal", held.len()));
            break;
        }
        match kit.qp(QpType::Ud) {
            Ok(qp) => held.push(qp),
            Err(SetupError::Verbs(e)) => {
                out.attempt(format!("UD QP number {}", held.len() + 1), Err::<(), _>(e));
                out.notes
                    .push(format!("refused after {} UD QPs", held.len()));
                break;
            }
            Err(other) => return Err(other),
        }
    }
    let created = held.len();
    held.clear();
    match kit.qp(QpType::Ud) {
        Ok(_) => out.controls_passed += 1,
        Err(e) => out
            .controls_failed
            .push(format!("a UD QP after destroying {created}: {e}")),
    }
    Ok(())
}

pub(super) fn log_flood(kit: &Kit, targets: &Targets, out: &mut Outcome) -> Result<()> {
    // An unknown opcode, and a known one with a body too short for it.
    let unknown = [0xff, 0xff, 0, 0, 0, 0, 0, 0];
    let mut short = Vec::new();
    ControlRequest::DeregMr(HandleReq {
        handle: Le32::new(1),
        reserved: Le32::ZERO,
    })
    .encode_into(&mut short);
    short.truncate(short.len() - 2);
    for i in 0..targets.flood {
        let (opcode, bytes) = if i % 2 == 0 {
            (Opcode::QueryDevice, &unknown[..])
        } else {
            (Opcode::DeregMr, &short[..])
        };
        out.attempt_raw(
            format!("malformed command {i}"),
            raw_bytes(&kit.ctx, opcode, bytes),
        );
    }
    match raw(&kit.ctx, &ControlRequest::QueryDevice) {
        Ok(_) => out.controls_passed += 1,
        Err(status) => out
            .controls_failed
            .push(format!("QUERY_DEVICE after the flood: {status}")),
    }
    Ok(())
}
