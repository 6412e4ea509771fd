//! One ping-pong session: a connected pair of queue pairs running a plan step by step, as
//! server or client (posting, waiting for and checking completions, verifying the data,
//! measuring latency and bandwidth).

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use vrdma::provider::{SendFlags, SendWr, WcFlags, WorkCompletion};
use vrdma::spec::verbs::{WcOpcode, WcStatus, WrOpcode};
use vrdma::verbs::{Cq, Qp};

use super::endpoint::{Endpoint, WRID_RC_RECV, WRID_SEND, WRID_UD_RECV};
use super::error::{Result, RunError};
use super::exchange::{Hello, Message};
use super::oob::Channel;
use super::options::Options;
use super::pattern::{self, Direction, PatternKey};
use super::plan::{grh_source_gid, Mode, Op, GRH_LEN};
use super::report::Row;
use super::stats::{summarize, throughput, LatencySummary};
use super::wait::{EventCounts, WaitError, Waiter};
use super::UD_QKEY;

/// What a receive completion must look like.
#[derive(Clone, Copy, Debug)]
struct Expect {
    ud: bool,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
}

/// A 0-byte RC SEND: "done", "ready" or "ack".
const CONTROL: Expect = Expect {
    ud: false,
    opcode: WcOpcode::Recv,
    byte_len: 0,
    imm: None,
};

/// Which completion queue to wait on.
#[derive(Clone, Copy)]
enum Queue {
    Send,
    Recv,
}

impl Queue {
    /// Index of the queue in the session's [`Waiter`].
    const fn index(self) -> usize {
        match self {
            Queue::Send => 0,
            Queue::Recv => 1,
        }
    }

    /// The queue's CQ in `ep`, and its name for errors.
    fn of(self, ep: &Endpoint) -> (&Cq, &'static str) {
        match self {
            Queue::Send => (&ep.send_cq, "send"),
            Queue::Recv => (&ep.recv_cq, "receive"),
        }
    }
}

/// A connected pair of queue pairs running one plan.
pub(super) struct Session<'c> {
    pub(super) ep: Endpoint,
    peer: Hello,
    channel: &'c mut Channel,
    timeout: Duration,
    is_server: bool,
    sends_outstanding: u32,
    pub(super) rows: Vec<Row>,
    pub(super) steps_done: usize,
    /// One-way latencies of the current step, reused across steps.
    samples: Vec<f64>,
    /// Waits for completions on the send CQ and the receive CQ.
    pub(super) waiter: Waiter<2>,
    /// The waiter's counts when the previous step ended (zero before the first).
    step_start: EventCounts,
    /// [`Session::refused_kicks`] when the current step began.
    refused_kicks_at_start: u64,
}

impl<'c> Session<'c> {
    /// Connects the queue pairs and exchanges `ready`. Prints `READY` on stderr once this
    /// side's queue pairs are connected and its receives posted (the RC ones only later with
    /// `--receives-after`: `RECEIVES POSTED`), and `RUNNING` once both are.
    pub(super) fn start(
        mut ep: Endpoint,
        peer: Hello,
        channel: &'c mut Channel,
        opts: &Options,
        is_server: bool,
    ) -> Result<Self> {
        let timeout = opts.timeout;
        ep.connect(&peer, &opts.path, opts.receives_after.is_none())?;
        eprintln!("READY");
        if let Some(path) = &opts.start_file {
            wait_for_file(path, timeout)?;
        }
        // Nothing was sent yet and the peer sends only after `ready`: both CQs are empty.
        let mut waiter = Waiter::new(opts.completion);
        for queue in [Queue::Send, Queue::Recv] {
            let (cq, what) = queue.of(&ep);
            waiter
                .arm_empty(cq, queue.index())
                .map_err(|e| RunError::Events(what, e))?;
        }
        channel.send(&Message::Ready)?;
        match channel.receive()? {
            Message::Ready => {}
            other => {
                return Err(RunError::Protocol(format!(
                    "expected ready, got {:?}",
                    other.to_line().trim_end()
                )))
            }
        }
        eprintln!("RUNNING");
        if let Some(path) = &opts.receives_after {
            // The peer's first sends meet RNR NAKs meanwhile; a peer that gives up says so.
            wait_for_file_watching(path, timeout, channel)?;
            ep.post_rc_receives()?;
            eprintln!("RECEIVES POSTED");
        }
        let samples = match peer.plan.mode() {
            Mode::Verify if !is_server => Vec::with_capacity(peer.plan.iters() as usize),
            _ => Vec::new(),
        };
        Ok(Session {
            ep,
            peer,
            channel,
            timeout,
            is_server,
            sends_outstanding: 0,
            rows: Vec::new(),
            steps_done: 0,
            samples,
            waiter,
            step_start: EventCounts::default(),
            refused_kicks_at_start: 0,
        })
    }

    pub(super) fn run(&mut self) -> Result<()> {
        let plan = self.peer.plan.clone();
        for step in plan.steps() {
            let mut iter = 0;
            self.refused_kicks_at_start = self.refused_kicks();
            let result = match plan.mode() {
                Mode::Verify => self.verify_step(step.op, step.size, plan.iters(), &mut iter),
                Mode::Bandwidth { window } => {
                    self.bw_step(step.op, step.size, plan.iters(), window, &mut iter)
                }
                Mode::Oneway => self.oneway_step(step.op, step.size, plan.iters(), &mut iter),
            };
            let result = result.and_then(|()| self.settle());
            result.map_err(|e| RunError::InStep {
                op: step.op,
                size: step.size,
                iter,
                source: Box::new(e),
            })?;
            // The next step's counts begin here: the first one's include the arms made
            // before the run (`arm_empty`).
            self.step_start = self.waiter.counts();
            self.steps_done += 1;
        }
        self.reap_sends(self.sends_outstanding)?;
        self.channel.send(&Message::Done)?;
        match self.channel.receive()? {
            Message::Done => Ok(()),
            other => Err(RunError::Protocol(format!(
                "expected done, got {:?}",
                other.to_line().trim_end()
            ))),
        }
    }

    fn inline_for(&self, op: Op, size: u32) -> bool {
        let max = match (&self.ep.ud, op) {
            (Some(ud), Op::UdSend) => ud.max_inline,
            _ => self.ep.max_inline,
        };
        op != Op::Read && size <= max
    }

    // ---- Posting and polling ----

    /// Posts one signaled send-queue request; payloads come from the source half, except
    /// that an RDMA READ lands in the area.
    fn post(&mut self, opcode: WrOpcode, size: u32, imm: u32, ud: bool) -> Result<()> {
        let len = size as usize;
        let sge = [if opcode == WrOpcode::RdmaRead {
            self.ep.area_sge(len)
        } else {
            self.ep.source_sge(len)
        }];
        let max_inline = match (&self.ep.ud, ud) {
            (Some(end), true) => end.max_inline,
            _ => self.ep.max_inline,
        };
        let mut flags = SendFlags::SIGNALED;
        if size > 0 && size <= max_inline && opcode.allows_inline() {
            flags |= SendFlags::INLINE;
        }
        let (qp, dest) = match (&self.ep.ud, ud) {
            (Some(end), true) => {
                let ah = end
                    .ah
                    .as_ref()
                    .ok_or_else(|| RunError::Protocol("UD send before connecting".into()))?;
                (
                    &end.qp,
                    Some(ah.dest(self.peer.ud_qpn.unwrap_or(0), UD_QKEY)),
                )
            }
            _ => (&self.ep.qp, None),
        };
        let wr = SendWr {
            wr_id: WRID_SEND,
            opcode,
            flags,
            sg_list: if size > 0 { &sge } else { &[] },
            imm_data: imm.to_be(),
            remote_addr: if opcode.is_rdma() { self.peer.addr } else { 0 },
            rkey: if opcode.is_rdma() { self.peer.rkey } else { 0 },
            ud: dest,
            ..SendWr::default()
        };
        // SAFETY: the SGE lies in the endpoint's registered buffer, which outlives the queue
        // pair, so inline bytes are readable now and DMA-read bytes stay registered.
        unsafe { qp.post_send(&[wr]) }?;
        self.sends_outstanding += 1;
        Ok(())
    }

    /// Waits for at least one completion on `queue`, watching the peer meanwhile; moves up to
    /// `out.len()` of them into `out` and returns how many.
    fn wait(&mut self, queue: Queue, out: &mut [WorkCompletion]) -> Result<usize> {
        let (cq, what) = queue.of(&self.ep);
        let channel = &mut *self.channel;
        let ctx = &self.ep.ctx;
        // Between polls: has the peer given up, or has this side's device gone away?
        self.waiter
            .next(cq, queue.index(), out, self.timeout, || {
                channel.check_peer()?;
                ctx.check_alive().map_err(WaitError::Device)
            })
            .map_err(|e| wait_error(what, e))
    }

    /// Takes the completion events this side's completions made certain (see
    /// [`Waiter::settle`]), so that they count in the step that raised them.
    fn settle(&mut self) -> Result<()> {
        for queue in [Queue::Send, Queue::Recv] {
            let (cq, what) = queue.of(&self.ep);
            let channel = &mut *self.channel;
            let ctx = &self.ep.ctx;
            self.waiter
                .settle(cq, queue.index(), self.timeout, || {
                    channel.check_peer()?;
                    ctx.check_alive().map_err(WaitError::Device)
                })
                .map_err(|e| wait_error(what, e))?;
        }
        Ok(())
    }

    /// Waits for one successful completion on `queue`.
    fn poll_one(&mut self, queue: Queue) -> Result<WorkCompletion> {
        let mut wc = [WorkCompletion::default()];
        self.wait(queue, &mut wc)?;
        let wc = wc[0];
        if wc.status != WcStatus::Success {
            // A flushed receive only says that the QP is in error; the send that failed (if
            // it completed already) says why, e.g. RnrRetryExcErr.
            if matches!(queue, Queue::Recv) && wc.status == WcStatus::WrFlushErr {
                if let Some(cause) = self.failed_send() {
                    return Err(RunError::Completion {
                        what: "send",
                        status: cause.status,
                        vendor_err: cause.vendor_err,
                    });
                }
            }
            return Err(RunError::Completion {
                what: match queue {
                    Queue::Send => "send",
                    Queue::Recv => "receive",
                },
                status: wc.status,
                vendor_err: wc.vendor_err,
            });
        }
        Ok(wc)
    }

    /// The first unsuccessful send completion not flushed, among those completed (this side
    /// is failing: the send queue's accounting no longer matters).
    fn failed_send(&mut self) -> Option<WorkCompletion> {
        let mut wcs = [WorkCompletion::default(); 16];
        loop {
            let n = self.ep.send_cq.poll(&mut wcs);
            if n == 0 {
                return None;
            }
            if let Some(wc) = wcs[..n]
                .iter()
                .find(|wc| !matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr))
            {
                return Some(*wc);
            }
        }
    }

    fn reap_sends(&mut self, count: u32) -> Result<()> {
        for _ in 0..count {
            let wc = self.poll_one(Queue::Send)?;
            if wc.wr_id != WRID_SEND {
                return Err(RunError::BadCompletion(format!(
                    "send completion with unknown wr_id {}",
                    wc.wr_id
                )));
            }
            self.sends_outstanding -= 1;
        }
        Ok(())
    }

    /// Waits for one receive, reposts it and checks it against `e`.
    fn receive(&mut self, e: &Expect) -> Result<()> {
        let wc = self.poll_one(Queue::Recv)?;
        let wanted = if e.ud { WRID_UD_RECV } else { WRID_RC_RECV };
        if wc.wr_id != wanted {
            return Err(RunError::BadCompletion(format!(
                "receive completed with wr_id {}, expected {wanted}",
                wc.wr_id
            )));
        }
        self.ep.post_recv(e.ud)?;
        let bad = |what: String| Err(RunError::BadCompletion(what));
        if wc.opcode != e.opcode {
            return bad(format!(
                "receive opcode {:?}, expected {:?}",
                wc.opcode, e.opcode
            ));
        }
        if wc.byte_len != e.byte_len {
            return bad(format!(
                "receive of {} bytes, expected {}",
                wc.byte_len, e.byte_len
            ));
        }
        let with_imm = wc.wc_flags.contains(WcFlags::WITH_IMM);
        match e.imm {
            Some(imm) if !with_imm => return bad(format!("no immediate data, expected {imm}")),
            Some(imm) if u32::from_be(wc.imm_data) != imm => {
                return bad(format!(
                    "immediate data {}, expected {imm}",
                    u32::from_be(wc.imm_data)
                ))
            }
            None if with_imm => return bad("unexpected immediate data".into()),
            _ => {}
        }
        if e.ud {
            if !wc.wc_flags.contains(WcFlags::GRH) {
                return bad("UD receive without GRH flag".into());
            }
            let peer = self.peer.ud_qpn.unwrap_or(0);
            if wc.src_qp != peer {
                return bad(format!("UD receive from QP {}, expected {peer}", wc.src_qp));
            }
        }
        Ok(())
    }

    // ---- Payloads ----

    fn send_payload(&mut self, op: Op, size: u32, iter: u32) -> Result<()> {
        match op {
            Op::Send => self.post(WrOpcode::Send, size, 0, false),
            Op::SendImm => self.post(WrOpcode::SendWithImm, size, iter, false),
            Op::Write => {
                self.post(WrOpcode::RdmaWrite, size, 0, false)?;
                self.post(WrOpcode::Send, 0, 0, false) // done
            }
            Op::WriteImm => self.post(WrOpcode::RdmaWriteWithImm, size, iter, false),
            Op::UdSend => self.post(WrOpcode::Send, size, 0, true),
            Op::Read => Err(RunError::Protocol("read has no payload message".into())),
        }
    }

    fn receive_payload(&mut self, op: Op, size: u32, iter: u32) -> Result<()> {
        let plain = Expect {
            ud: false,
            opcode: WcOpcode::Recv,
            byte_len: size,
            imm: None,
        };
        let e = match op {
            Op::Send => plain,
            Op::SendImm => Expect {
                imm: Some(iter),
                ..plain
            },
            Op::Write => CONTROL,
            Op::WriteImm => Expect {
                opcode: WcOpcode::RecvRdmaWithImm,
                imm: Some(iter),
                ..plain
            },
            Op::UdSend => Expect {
                ud: true,
                byte_len: size + GRH_LEN,
                ..plain
            },
            Op::Read => return Err(RunError::Protocol("read has no payload message".into())),
        };
        self.receive(&e)
    }

    fn fill_source(&mut self, op: Op, size: u32, iter: u32, direction: Direction) {
        let key = PatternKey {
            op,
            size,
            iter,
            direction,
        };
        pattern::fill(&key, self.ep.source_mut(size as usize));
    }

    fn verify_area(&self, op: Op, size: u32, iter: u32, direction: Direction) -> Result<()> {
        let offset = if op == Op::UdSend {
            // The packet came from the address the peer announced (a guest can send only
            // from its own addresses).
            let source = grh_source_gid(self.ep.area(0, GRH_LEN as usize));
            if source != Some(self.peer.gid) {
                return Err(RunError::BadCompletion(format!(
                    "UD message from source {}, expected the peer's {}",
                    source.map_or("(no IP header)".into(), |s| Ipv6Addr::from(s).to_string()),
                    Ipv6Addr::from(self.peer.gid)
                )));
            }
            GRH_LEN as usize
        } else {
            0
        };
        let key = PatternKey {
            op,
            size,
            iter,
            direction,
        };
        pattern::verify(&key, self.ep.area(offset, size as usize)).map_err(RunError::Mismatch)
    }

    // ---- Verify mode ----

    fn verify_step(&mut self, op: Op, size: u32, iters: u32, iter: &mut u32) -> Result<()> {
        self.samples.clear();
        let mut total = Duration::ZERO;
        for i in 0..iters {
            *iter = i;
            if self.is_server {
                self.server_iteration(op, size, i)?;
            } else {
                let rtt = self.client_iteration(op, size, i)?;
                total += rtt;
                self.samples.push(rtt.as_secs_f64() / 2.0 * 1e6);
            }
        }
        if self.is_server {
            return Ok(());
        }
        // Payloads per timed interval: two for a round trip, one for a read.
        let per_iter = if op == Op::Read { 1 } else { 2 };
        let rates = throughput(u64::from(iters) * per_iter, size, total);
        let latency = summarize(&mut self.samples);
        self.push_row(op, size, iters, latency, rates)?;
        Ok(())
    }

    fn server_iteration(&mut self, op: Op, size: u32, i: u32) -> Result<()> {
        if op == Op::Read {
            let key = PatternKey {
                op,
                size,
                iter: i,
                direction: Direction::ServerToClient,
            };
            pattern::fill(&key, self.ep.area_mut(size as usize));
            self.post(WrOpcode::Send, 0, 0, false)?; // ready
            self.receive(&CONTROL)?; // ack
            return self.reap_sends(self.sends_outstanding);
        }
        self.fill_source(op, size, i, Direction::ServerToClient);
        self.receive_payload(op, size, i)?;
        self.verify_area(op, size, i, Direction::ClientToServer)?;
        self.send_payload(op, size, i)?;
        self.reap_sends(self.sends_outstanding)
    }

    /// One round trip; returns its duration.
    fn client_iteration(&mut self, op: Op, size: u32, i: u32) -> Result<Duration> {
        if op == Op::Read {
            self.receive(&CONTROL)?; // ready
            let t0 = Instant::now();
            self.post(WrOpcode::RdmaRead, size, 0, false)?;
            self.reap_sends(1)?;
            let rtt = t0.elapsed();
            self.verify_area(op, size, i, Direction::ServerToClient)?;
            self.post(WrOpcode::Send, 0, 0, false)?; // ack
            self.reap_sends(1)?;
            return Ok(rtt);
        }
        self.fill_source(op, size, i, Direction::ClientToServer);
        let t0 = Instant::now();
        self.send_payload(op, size, i)?;
        self.receive_payload(op, size, i)?;
        let rtt = t0.elapsed();
        self.reap_sends(self.sends_outstanding)?;
        self.verify_area(op, size, i, Direction::ServerToClient)?;
        Ok(rtt)
    }

    // ---- One-way mode ----

    fn oneway_step(&mut self, op: Op, size: u32, iters: u32, iter: &mut u32) -> Result<()> {
        let mut total = Duration::ZERO;
        for i in 0..iters {
            *iter = i;
            if self.is_server {
                self.receive_payload(op, size, i)?;
                self.verify_area(op, size, i, Direction::ClientToServer)?;
                self.channel.send(&Message::Ack)?;
                continue;
            }
            self.fill_source(op, size, i, Direction::ClientToServer);
            let t0 = Instant::now();
            self.send_payload(op, size, i)?;
            self.reap_sends(self.sends_outstanding)?;
            match self.channel.receive()? {
                Message::Ack => {}
                other => {
                    return Err(RunError::Protocol(format!(
                        "expected ack, got {:?}",
                        other.to_line().trim_end()
                    )))
                }
            }
            total += t0.elapsed();
        }
        if !self.is_server {
            let rates = throughput(iters.into(), size, total);
            self.push_row(op, size, iters, None, rates)?;
        }
        Ok(())
    }

    // ---- Bandwidth mode ----

    fn bw_step(&mut self, op: Op, size: u32, n: u32, window: u32, iter: &mut u32) -> Result<()> {
        let opcode = if op == Op::Write {
            WrOpcode::RdmaWrite
        } else {
            WrOpcode::Send
        };
        if self.is_server {
            if op == Op::Send {
                let e = Expect {
                    ud: false,
                    opcode: WcOpcode::Recv,
                    byte_len: size,
                    imm: None,
                };
                for i in 0..n {
                    *iter = i;
                    self.receive(&e)?;
                }
            } else {
                self.receive(&CONTROL)?; // done
            }
            *iter = n - 1;
            self.verify_area(op, size, n - 1, Direction::ClientToServer)?;
            self.post(WrOpcode::Send, 0, 0, false)?; // ack
            return self.reap_sends(1);
        }

        self.fill_source(op, size, 0, Direction::ClientToServer);
        let mut wcs = [WorkCompletion::default(); 16];
        let (mut posted, mut completed) = (0u32, 0u32);
        let t0 = Instant::now();
        while completed < n - 1 {
            while posted < n - 1 && posted - completed < window {
                *iter = posted;
                self.post(opcode, size, 0, false)?;
                posted += 1;
            }
            // At least one message is outstanding here, so a completion is due.
            let got = self.wait(Queue::Send, &mut wcs)?;
            for (k, wc) in wcs[..got].iter().enumerate() {
                if wc.status != WcStatus::Success {
                    *iter = completed + k as u32;
                    return Err(RunError::Completion {
                        what: "send",
                        status: wc.status,
                        vendor_err: wc.vendor_err,
                    });
                }
            }
            completed += got as u32;
            self.sends_outstanding -= got as u32;
        }
        // The last message carries its own iteration, proving it landed after the others.
        let streamed = t0.elapsed();
        *iter = n - 1;
        self.fill_source(op, size, n - 1, Direction::ClientToServer);
        let t_last = Instant::now();
        self.post(opcode, size, 0, false)?;
        self.reap_sends(1)?;
        let elapsed = streamed + t_last.elapsed();
        if op == Op::Write {
            self.post(WrOpcode::Send, 0, 0, false)?; // done
            self.reap_sends(1)?;
        }
        self.receive(&CONTROL)?; // ack: the server verified the last message
        let rates = throughput(n.into(), size, elapsed);
        self.push_row(op, size, n, None, rates)?;
        Ok(())
    }

    /// Records the result of the current step: its latency (if measured), its `(MiB/s,
    /// Mmsg/s)` rates, and how completions were awaited during it.
    fn push_row(
        &mut self,
        op: Op,
        size: u32,
        iters: u32,
        latency: Option<LatencySummary>,
        (mib_s, mmsg_s): (f64, f64),
    ) -> Result<()> {
        self.settle()?;
        self.rows.push(Row {
            op,
            size,
            iters,
            inline: self.inline_for(op, size),
            latency,
            mib_s,
            mmsg_s,
            completion: self.waiter.mode(),
            events: self.waiter.counts().since(&self.step_start),
            host_kick: self.send_qp(op).kicks_host(),
            kicks_refused: self.refused_kicks() - self.refused_kicks_at_start,
        });
        Ok(())
    }

    /// The QP `op`'s sends go through.
    fn send_qp(&self, op: Op) -> &Qp {
        match (&self.ep.ud, op) {
            (Some(ud), Op::UdSend) => &ud.qp,
            _ => &self.ep.qp,
        }
    }

    /// Host kicks refused on this side's QPs so far.
    fn refused_kicks(&self) -> u64 {
        let ud = self
            .ep
            .ud
            .as_ref()
            .map_or(0, |ud| ud.qp.refused_host_kicks());
        self.ep.qp.refused_host_kicks() + ud
    }
}

/// The run error of a wait on the `what` CQ.
fn wait_error(what: &'static str, e: WaitError) -> RunError {
    match e {
        WaitError::Timeout(after) => RunError::Timeout(what, after),
        WaitError::Peer(e) => RunError::Oob(e),
        e => RunError::Events(what, e),
    }
}

/// Waits up to `timeout` for the start file `path` to exist.
fn wait_for_file(path: &std::path::Path, timeout: Duration) -> Result<()> {
    wait_for("start file", path, timeout, || Ok(()))
}

/// Waits up to `timeout` for `path` to exist, failing as soon as the peer reports a failure.
fn wait_for_file_watching(
    path: &std::path::Path,
    timeout: Duration,
    channel: &mut Channel,
) -> Result<()> {
    wait_for("file", path, timeout, || {
        channel.check_peer().map_err(RunError::from)
    })
}

fn wait_for(
    what: &str,
    path: &std::path::Path,
    timeout: Duration,
    mut check: impl FnMut() -> Result<()>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        check()?;
        if Instant::now() > deadline {
            return Err(RunError::Protocol(format!(
                "{what} {} did not appear within {} s",
                path.display(),
                timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
