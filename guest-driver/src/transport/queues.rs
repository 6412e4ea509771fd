//! The control and event queues as every transport drives them; only how a queue is notified
//! and how the driver sleeps until the device used buffers differ ([`QueueSignal`]).
//!
//! Control commands: one chain per command (request bytes, then response bytes, each split
//! at the discontinuities of its DMA buffer), from any number of threads at once, each with a
//! timeout after which the queue is considered broken: the device may still write into the buffers of a
//! chain it never returned, so they can never be reused. Events: a fixed set of
//! device-writable buffers kept posted, each re-posted once its event has been copied out.

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::TransportError;
use crate::dma::{DmaBuffer, DmaMemory, PAGE_SIZE};
use crate::virtq::{Buffer, SplitQueue, UsedElement};

/// How a transport notifies one virtqueue and waits for the device to use its buffers.
pub(crate) trait QueueSignal: Send + Sync {
    /// What [`QueueSignal::wait`] needs to know about notifications that arrive between
    /// [`QueueSignal::arm`] and the wait.
    type Ticket;

    /// Tells the device that the queue has new available buffers.
    fn notify(&self) -> Result<(), TransportError>;

    /// Called before the driver's last look at the used ring; a notification the device sends
    /// after this call ends the [`QueueSignal::wait`] given the returned ticket.
    fn arm(&self) -> Self::Ticket;

    /// Sleeps until the device may have used buffers, or `deadline` (`None`: never) passes.
    /// Returns false on timeout.
    fn wait(&self, ticket: Self::Ticket, deadline: Option<Instant>)
        -> Result<bool, TransportError>;
}

/// A virtqueue and how to signal it.
pub(crate) struct SignalledQueue<S> {
    pub(crate) queue: SplitQueue,
    pub(crate) signal: S,
}

impl<S: QueueSignal> SignalledQueue<S> {
    /// Notifies the device if it asked for notifications of what was just published.
    fn notify_if_wanted(&mut self) -> Result<(), TransportError> {
        if self.queue.should_notify() {
            self.signal.notify()?;
        }
        Ok(())
    }

    /// The next used chain, waiting until `deadline` for one; `Ok(None)` on timeout.
    fn next_used(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<UsedElement>, TransportError> {
        self.next_used_of(1, deadline, None)
    }

    /// Like [`next_used`](Self::next_used) while `outstanding` chains are awaited: asks to be
    /// woken only by the last of them (with EVENT_IDX), so that a batch costs one wake-up.
    /// Until `spin_until`, it polls the used ring instead of sleeping.
    fn next_used_of(
        &mut self,
        outstanding: u16,
        deadline: Option<Instant>,
        spin_until: Option<Instant>,
    ) -> Result<Option<UsedElement>, TransportError> {
        loop {
            if let Some(used) = self.queue.pop_used()? {
                return Ok(Some(used));
            }
            if spin_until.is_some_and(|until| Instant::now() < until) {
                // Yield rather than spin: the answer may need a thread that waits for this
                // CPU (the back-end's, or this process's own handler of the back-end's
                // SHMEM_MAP requests, which the command waits for).
                std::thread::yield_now();
                continue;
            }
            let ticket = self.signal.arm();
            if self.queue.enable_interrupts_after(outstanding) {
                continue;
            }
            if !self.signal.wait(ticket, deadline)? {
                return Ok(None);
            }
        }
    }
}

/// A DMA buffer with the bus-address ranges it covers, physically contiguous pages merged.
struct MappedBuffer {
    buffer: DmaBuffer,
    segments: Vec<Buffer>,
}

/// Longest descriptor this module writes (a descriptor's length is 32 bits).
const MAX_SEGMENT: u32 = 1 << 31;

impl MappedBuffer {
    fn new(dma: &dyn DmaMemory, buffer: DmaBuffer) -> Result<Self, TransportError> {
        let pages = dma.translate(buffer.as_ptr(), buffer.len())?;
        let mut segments: Vec<Buffer> = Vec::new();
        let mut left = buffer.len();
        for page in pages {
            let len = left.min(PAGE_SIZE) as u32;
            left -= len as usize;
            match segments.last_mut() {
                Some(last)
                    if last.addr + u64::from(last.len) == page && last.len <= MAX_SEGMENT - len =>
                {
                    last.len += len;
                }
                _ => segments.push(Buffer { addr: page, len }),
            }
        }
        Ok(MappedBuffer { buffer, segments })
    }

    fn alloc(dma: &dyn DmaMemory, len: usize) -> Result<Self, TransportError> {
        Self::new(dma, dma.alloc(len, PAGE_SIZE)?)
    }

    /// Appends the ranges holding bytes `offset..offset + len` of the buffer to `out`.
    fn range_into(&self, offset: usize, len: usize, out: &mut Vec<Buffer>) {
        let mut skip = offset;
        let mut left = len;
        for segment in &self.segments {
            if left == 0 {
                break;
            }
            let segment_len = segment.len as usize;
            if skip >= segment_len {
                skip -= segment_len;
                continue;
            }
            let take = left.min(segment_len - skip);
            out.push(Buffer {
                addr: segment.addr + skip as u64,
                len: take as u32,
            });
            skip = 0;
            left -= take;
        }
    }
}

/// How long a control round trip polls for its answer before it sleeps: 1.5 times the
/// typical round trip of this channel (an average over the recent ones), at most `cap`. A
/// caller that sleeps pays a wake-up on top of the device's work, which under virtualization
/// (an interrupt, or an eventfd to a halted vCPU) is a large part of a short command; one
/// that polls for about as long as a command takes is answered without it, and a command
/// that takes much longer (a large registration) costs at most `cap` of polling.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdaptiveSpin {
    cap: Duration,
    typical: Duration,
}

impl AdaptiveSpin {
    /// Polls at most `cap` per round trip (`Duration::ZERO`: always sleeps at once).
    pub(crate) fn new(cap: Duration) -> Self {
        AdaptiveSpin {
            cap,
            typical: Duration::ZERO,
        }
    }

    /// How long the next round trip, of `commands` commands, polls.
    fn budget(&self, commands: u32) -> Duration {
        (self.typical * 3 / 2)
            .saturating_mul(commands)
            .min(self.cap)
    }

    /// Counts a round trip of `commands` commands that took `took` into the typical time of
    /// one (weight 1/8).
    fn record(&mut self, took: Duration, commands: u32) {
        self.typical = (self.typical * 7 + took / commands.max(1)) / 8;
    }
}

/// The control queue: commands from any number of threads in flight at once (spec §5.1), each
/// caller waiting for its own answers only.
///
/// One caller at a time waits for the device (polls the used ring, then sleeps on the signal,
/// without the lock) and files every answer it collects; the others wait on
/// [`ControlChannel::answered`] and take theirs from there. The one waiting for the device is
/// the caller of the oldest command in flight: the device answers in order, so its wake-up is
/// for its own answer (a newer caller would be woken by an older one's answer only to hand
/// it on and sleep again). Whoever collected answers wakes the others and the next oldest
/// takes over. So a thread's command no longer waits for another thread's whole round trip
/// before it is even sent: the device finds it queued behind the command it is running, and
/// its caller often finds the answer already collected when it is woken.
pub(crate) struct ControlChannel<S> {
    signal: S,
    state: Mutex<ControlState>,
    /// Notified when answers were filed or the thread waiting for the device stopped.
    answered: Condvar,
    timeout: Duration,
}

struct ControlState {
    queue: SplitQueue,
    /// Command buffers no caller holds; each caller takes one set for its commands.
    idle: Vec<CommandBuffers>,
    /// Command buffers of calls that broke the channel: the device may still write into
    /// those of a chain it never returned, so they are neither reused nor freed while the
    /// queue lives.
    retired: Vec<CommandBuffers>,
    /// The command each chain in flight carries, by head (its sequence number).
    chains: Vec<Option<u64>>,
    /// Answers collected from the used ring that their callers have not taken yet: (sequence
    /// number, used length). Keyed by command, not by head: the head's descriptors are free
    /// again once the answer is collected, and another caller's chain may take them.
    answered: Vec<(u64, u32)>,
    /// Sequence number of the next command published.
    next_sequence: u64,
    /// Chains made available whose answers nobody collected from the used ring yet.
    in_flight: usize,
    /// A caller is waiting for the device (the others wait on `answered`).
    device_waiter: bool,
    broken: bool,
    spin: AdaptiveSpin,
}

/// One caller's request and response buffers, and the descriptor lists of the chain it
/// builds (kept to reuse their allocations).
struct CommandBuffers {
    request: MappedBuffer,
    response: MappedBuffer,
    readable: Vec<Buffer>,
    writable: Vec<Buffer>,
}

impl CommandBuffers {
    fn alloc(dma: &dyn DmaMemory, request: usize, response: usize) -> Result<Self, TransportError> {
        Ok(CommandBuffers {
            request: MappedBuffer::alloc(dma, request.max(PAGE_SIZE).next_power_of_two())?,
            response: MappedBuffer::alloc(dma, response.max(PAGE_SIZE).next_power_of_two())?,
            readable: Vec::new(),
            writable: Vec::new(),
        })
    }

    /// Makes the buffers at least as large as `request` and `response` bytes.
    fn reserve(
        &mut self,
        dma: &dyn DmaMemory,
        request: usize,
        response: usize,
    ) -> Result<(), TransportError> {
        if self.request.buffer.len() < request {
            self.request = MappedBuffer::alloc(dma, request.next_power_of_two())?;
        }
        if self.response.buffer.len() < response {
            self.response = MappedBuffer::alloc(dma, response.next_power_of_two())?;
        }
        Ok(())
    }
}

/// The commands of one caller's batch that are in flight: (sequence number, index in the
/// batch).
type Sent = Vec<(u64, usize)>;

impl<S: QueueSignal> ControlChannel<S> {
    /// Drives the control queue `vq`; commands that take longer than `timeout` fail and
    /// leave the channel broken; `spin`: how its round trips wait for answers.
    pub(crate) fn new(
        dma: &dyn DmaMemory,
        vq: SignalledQueue<S>,
        timeout: Duration,
        spin: AdaptiveSpin,
    ) -> Result<Self, TransportError> {
        let SignalledQueue { queue, signal } = vq;
        Ok(ControlChannel {
            signal,
            state: Mutex::new(ControlState {
                chains: vec![None; usize::from(queue.size())],
                answered: Vec::new(),
                next_sequence: 0,
                queue,
                idle: vec![CommandBuffers::alloc(dma, PAGE_SIZE, PAGE_SIZE)?],
                retired: Vec::new(),
                in_flight: 0,
                device_waiter: false,
                broken: false,
                spin,
            }),
            answered: Condvar::new(),
            timeout,
        })
    }

    /// See [`super::Transport::round_trip`]: a batch of one.
    pub(crate) fn round_trip(
        &self,
        dma: &dyn DmaMemory,
        request: &[u8],
        response: &mut [u8],
    ) -> Result<usize, TransportError> {
        let used = self.round_trip_batch(dma, &mut [(request, response)])?;
        Ok(used[0])
    }

    /// See [`super::Transport::round_trip_batch`]: the commands go out as chains in order, as
    /// many as the queue holds before one notification, and the call returns once the device
    /// answered all of them.
    pub(crate) fn round_trip_batch(
        &self,
        dma: &dyn DmaMemory,
        commands: &mut [(&[u8], &mut [u8])],
    ) -> Result<Vec<usize>, TransportError> {
        for (request, response) in commands.iter() {
            if request.is_empty() || response.is_empty() {
                return Err(TransportError::InvalidRequest(
                    "a command needs request and response bytes",
                ));
            }
            u32::try_from(request.len().max(response.len()))
                .map_err(|_| TransportError::InvalidRequest("size"))?;
        }
        let total_request: usize = commands.iter().map(|(q, _)| q.len()).sum();
        let total_response: usize = commands.iter().map(|(_, r)| r.len()).sum();
        let mut buffers = self.take_buffers(dma, total_request, total_response)?;
        let mut used_lens = vec![0usize; commands.len()];
        let mut result = Ok(());
        let mut next = 0;
        while next < commands.len() {
            match self.run_batch(&mut buffers, commands, next, &mut used_lens) {
                Ok(end) => next = end,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let mut state = self.state.lock();
        if state.broken {
            state.retired.push(buffers);
            // Whoever waits for an answer learns that none is coming.
            self.answered.notify_all();
        } else {
            // A failure that leaves the channel whole came before this call's chains went
            // out, or after all of them were answered.
            state.idle.push(buffers);
        }
        result.map(|()| used_lens)
    }

    /// A set of command buffers of at least the sizes given, from the pool if it has one.
    fn take_buffers(
        &self,
        dma: &dyn DmaMemory,
        request: usize,
        response: usize,
    ) -> Result<CommandBuffers, TransportError> {
        let pooled = {
            let mut state = self.state.lock();
            if state.broken {
                return Err(broken());
            }
            state.idle.pop()
        };
        match pooled {
            Some(mut buffers) => match buffers.reserve(dma, request, response) {
                Ok(()) => Ok(buffers),
                Err(e) => {
                    self.state.lock().idle.push(buffers);
                    Err(e)
                }
            },
            None => CommandBuffers::alloc(dma, request, response),
        }
    }

    /// Publishes the commands from `first` on, as many as the free descriptors take (at least
    /// one, waiting for other callers' chains to be answered if need be), notifies once and
    /// waits for their answers. Returns the index of the first command not sent. Request and
    /// response bytes sit at the same offsets in the command buffers as in the whole batch.
    fn run_batch(
        &self,
        buffers: &mut CommandBuffers,
        commands: &mut [(&[u8], &mut [u8])],
        first: usize,
        used_lens: &mut [usize],
    ) -> Result<usize, TransportError> {
        let request_offset: usize = commands[..first].iter().map(|(q, _)| q.len()).sum();
        let response_offset: usize = commands[..first].iter().map(|(_, r)| r.len()).sum();
        let mut guard = self.state.lock();
        let deadline = Instant::now() + self.timeout;
        let (sent, end) = loop {
            if guard.broken {
                return Err(broken());
            }
            let (sent, end) = guard.publish(buffers, commands, first, request_offset)?;
            if !sent.is_empty() {
                break (sent, end);
            }
            // Other callers' chains hold the descriptors this command needs.
            self.wait_turn(&mut guard, &[], deadline, None)?;
        };
        if guard.queue.should_notify() {
            if let Err(e) = self.signal.notify() {
                guard.broken = true;
                return Err(e);
            }
        }
        let sent_at = Instant::now();
        let deadline = sent_at + self.timeout;
        let in_flight = u32::try_from(sent.len()).unwrap_or(u32::MAX);
        let spin_until = Some(sent_at + guard.spin.budget(in_flight));
        let mut waiting = sent.clone();
        loop {
            guard.take_answers(&mut waiting, commands, used_lens)?;
            if waiting.is_empty() {
                break;
            }
            if guard.broken {
                return Err(broken());
            }
            self.wait_turn(&mut guard, &waiting, deadline, spin_until)?;
        }
        guard.spin.record(sent_at.elapsed(), in_flight);
        drop(guard);
        let mut at = response_offset;
        for &(_, index) in &sent {
            let response = &mut commands[index].1;
            let len = used_lens[index];
            response[..len].copy_from_slice(&buffers.response.buffer.as_slice()[at..at + len]);
            at += response.len();
        }
        Ok(end)
    }

    /// Waits until answers may have been filed: for the device if the oldest command in
    /// flight is one of `own` (this caller's, in the order sent), else for the caller that
    /// waits for it. Fails, and breaks the channel, once `deadline` passes.
    fn wait_turn(
        &self,
        guard: &mut MutexGuard<'_, ControlState>,
        own: &[(u64, usize)],
        deadline: Instant,
        spin_until: Option<Instant>,
    ) -> Result<(), TransportError> {
        let oldest_is_mine = own
            .first()
            .is_some_and(|&(sequence, _)| guard.oldest_in_flight() == Some(sequence));
        if guard.device_waiter || !oldest_is_mine {
            if self.answered.wait_until(guard, deadline).timed_out() {
                guard.broken = true;
                self.answered.notify_all();
                return Err(TransportError::Timeout(self.timeout));
            }
            return Ok(());
        }
        guard.device_waiter = true;
        let result = self.wait_for_device(guard, own.len(), deadline, spin_until);
        guard.device_waiter = false;
        if result.is_err() {
            guard.broken = true;
        }
        self.answered.notify_all();
        result
    }

    /// Collects the answers the device has used, polling until `spin_until` and then sleeping
    /// on the signal without the lock; returns once it filed at least one.
    fn wait_for_device(
        &self,
        guard: &mut MutexGuard<'_, ControlState>,
        own: usize,
        deadline: Instant,
        spin_until: Option<Instant>,
    ) -> Result<(), TransportError> {
        loop {
            if guard.collect_used()? {
                return Ok(());
            }
            if spin_until.is_some_and(|until| Instant::now() < until) {
                // Yield rather than spin: the answer may need a thread that waits for this
                // CPU (the back-end's, or this process's own handler of the back-end's
                // SHMEM_MAP requests, which the command waits for).
                MutexGuard::unlocked(guard, std::thread::yield_now);
                continue;
            }
            let ticket = self.signal.arm();
            // With EVENT_IDX, ask to be woken by this caller's last chain: its chains are the
            // oldest in flight, sent together, and answered in order (a batch costs one
            // wake-up; an answer out of order only wakes it later).
            if guard
                .queue
                .enable_interrupts_after(u16::try_from(own).unwrap_or(u16::MAX))
            {
                continue;
            }
            if !MutexGuard::unlocked(guard, || self.signal.wait(ticket, Some(deadline)))? {
                return Err(TransportError::Timeout(self.timeout));
            }
        }
    }
}

fn broken() -> TransportError {
    TransportError::DeviceFailure("an earlier command never completed".into())
}

impl ControlState {
    /// Puts the commands from `first` on the queue as chains, as many as the free
    /// descriptors take; returns their sequence numbers (none: not even the first fits now)
    /// and the index of the first command not published.
    fn publish(
        &mut self,
        buffers: &mut CommandBuffers,
        commands: &[(&[u8], &mut [u8])],
        first: usize,
        request_offset: usize,
    ) -> Result<(Sent, usize), TransportError> {
        let response_offset: usize = commands[..first].iter().map(|(_, r)| r.len()).sum();
        let (mut request_at, mut response_at) = (request_offset, response_offset);
        let mut sent = Sent::new();
        let mut end = first;
        while end < commands.len() {
            let (request, response) = &commands[end];
            buffers.readable.clear();
            buffers.writable.clear();
            buffers
                .request
                .range_into(request_at, request.len(), &mut buffers.readable);
            buffers
                .response
                .range_into(response_at, response.len(), &mut buffers.writable);
            let needed = buffers.readable.len() + buffers.writable.len();
            if needed > usize::from(self.queue.size()) {
                if !sent.is_empty() {
                    // Those sent go out and are answered first: an error now would leave
                    // chains in flight that nobody waits for.
                    break;
                }
                return Err(TransportError::InvalidRequest(
                    "a command needs more descriptors than the control queue has",
                ));
            }
            if needed > usize::from(self.queue.num_free()) {
                break;
            }
            buffers.request.buffer.as_mut_slice()[request_at..request_at + request.len()]
                .copy_from_slice(request);
            let head = self.queue.add(&buffers.readable, &buffers.writable)?;
            let sequence = self.next_sequence;
            self.next_sequence += 1;
            self.chains[usize::from(head)] = Some(sequence);
            self.in_flight += 1;
            sent.push((sequence, end));
            request_at += request.len();
            response_at += response.len();
            end += 1;
        }
        Ok((sent, end))
    }

    /// The sequence number of the oldest command in flight.
    fn oldest_in_flight(&self) -> Option<u64> {
        self.chains.iter().flatten().min().copied()
    }

    /// Files the answer of every chain the device has used; returns whether there was any.
    fn collect_used(&mut self) -> Result<bool, TransportError> {
        let mut any = false;
        while let Some(used) = self.queue.pop_used()? {
            let Some(sequence) = self.chains[usize::from(used.head)].take() else {
                return Err(TransportError::DeviceFailure(format!(
                    "control queue returned chain {}, which is not in flight",
                    used.head
                )));
            };
            self.answered.push((sequence, used.len));
            self.in_flight -= 1;
            any = true;
        }
        Ok(any)
    }

    /// Takes the answers filed for the commands in `waiting` (removing them from it),
    /// checking each used length against its response's size.
    fn take_answers(
        &mut self,
        waiting: &mut Sent,
        commands: &[(&[u8], &mut [u8])],
        used_lens: &mut [usize],
    ) -> Result<(), TransportError> {
        let mut result = Ok(());
        let answered = &mut self.answered;
        waiting.retain(|&(sequence, index)| {
            let Some(at) = answered.iter().position(|&(s, _)| s == sequence) else {
                return true;
            };
            let (_, len) = answered.swap_remove(at);
            let capacity = commands[index].1.len();
            if len as usize > capacity {
                result = Err(TransportError::DeviceFailure(format!(
                    "control queue returned {len} bytes for a {capacity}-byte response"
                )));
            } else {
                used_lens[index] = len as usize;
            }
            false
        });
        if result.is_err() {
            self.broken = true;
        }
        result
    }
}

/// The event queue: device-writable buffers kept posted.
pub(crate) struct EventChannel<S> {
    state: Mutex<EventState<S>>,
}

struct EventState<S> {
    vq: SignalledQueue<S>,
    buffers: DmaBuffer,
    buffer_size: u32,
    /// Bus address of each buffer slot.
    slot_addresses: Vec<u64>,
    /// Which buffer slot each in-flight chain head carries.
    slot_of_head: Vec<Option<usize>>,
}

impl<S: QueueSignal> EventChannel<S> {
    /// Posts `count` buffers of `buffer_size` bytes on the freshly set-up event queue `vq`
    /// without notifying the device (the transport does once the device runs). The count is
    /// clamped to the queue size and the size to a power of two of at most a page, so that no
    /// buffer crosses a page boundary.
    pub(crate) fn start(
        dma: &dyn DmaMemory,
        vq: SignalledQueue<S>,
        count: u16,
        buffer_size: u32,
    ) -> Result<Self, TransportError> {
        let count = usize::from(count.clamp(1, vq.queue.size()));
        let buffer_size = buffer_size.clamp(1, PAGE_SIZE as u32).next_power_of_two();
        let buffers = dma.alloc(count * buffer_size as usize, PAGE_SIZE)?;
        let pages = dma.translate(buffers.as_ptr(), buffers.len())?;
        let slot_addresses = (0..count)
            .map(|slot| {
                let offset = slot * buffer_size as usize;
                pages
                    .get(offset / PAGE_SIZE)
                    .map(|page| page + (offset % PAGE_SIZE) as u64)
                    .ok_or_else(|| {
                        TransportError::DeviceFailure("DMA translation lists too few pages".into())
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut events = EventState {
            slot_of_head: vec![None; usize::from(vq.queue.size())],
            vq,
            buffers,
            buffer_size,
            slot_addresses,
        };
        for slot in 0..count {
            events.post(slot)?;
        }
        Ok(EventChannel {
            state: Mutex::new(events),
        })
    }

    /// Notifies the event queue (after the device started, for the buffers posted by
    /// [`EventChannel::start`]).
    pub(crate) fn notify(&self) -> Result<(), TransportError> {
        self.state.lock().vq.signal.notify()
    }

    /// See [`super::Transport::next_event`].
    pub(crate) fn next_event(
        &self,
        out: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<Option<usize>, TransportError> {
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        let mut events = self.state.lock();
        let Some(used) = events.vq.next_used(deadline)? else {
            return Ok(None);
        };
        let len = events.take(used.head, used.len, out)?;
        events.repost(used.head)?;
        Ok(Some(len))
    }
}

impl<S: QueueSignal> EventState<S> {
    fn take(&mut self, head: u16, len: u32, out: &mut [u8]) -> Result<usize, TransportError> {
        let slot = self.slot_of_head[usize::from(head)]
            .ok_or_else(|| TransportError::DeviceFailure(format!("event chain {head} unknown")))?;
        if len > self.buffer_size {
            return Err(TransportError::DeviceFailure(format!(
                "event of {len} bytes in a {}-byte buffer",
                self.buffer_size
            )));
        }
        let len = len as usize;
        let start = slot * self.buffer_size as usize;
        let copied = len.min(out.len());
        out[..copied].copy_from_slice(&self.buffers.as_slice()[start..start + copied]);
        Ok(len)
    }

    fn repost(&mut self, head: u16) -> Result<(), TransportError> {
        let slot = self.slot_of_head[usize::from(head)]
            .take()
            .ok_or_else(|| TransportError::DeviceFailure(format!("event chain {head} unknown")))?;
        self.post(slot)?;
        self.vq.notify_if_wanted()
    }

    fn post(&mut self, slot: usize) -> Result<(), TransportError> {
        let buffer = Buffer {
            addr: self.slot_addresses[slot],
            len: self.buffer_size,
        };
        let head = self.vq.queue.add(&[], &[buffer])?;
        self.slot_of_head[usize::from(head)] = Some(slot);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::dma::DmaError;
    use crate::transport::process::ProcessDma;
    use crate::virtq::test_device::{RingDevice, SeenChain};

    /// DMA memory whose pages are scattered: page i of every allocation lies at a bus
    /// address that does not follow page i - 1, except where listed as contiguous.
    struct ScatteredDma {
        inner: ProcessDma,
    }

    impl DmaMemory for ScatteredDma {
        fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, DmaError> {
            self.inner.alloc(len, align)
        }

        fn translate(&self, addr: *const u8, len: usize) -> Result<Vec<u64>, DmaError> {
            let pages = self.inner.translate(addr, len)?;
            // Pages 0 and 1 stay adjacent; from page 2 on each is moved far away.
            Ok(pages
                .into_iter()
                .enumerate()
                .map(|(i, page)| {
                    if i < 2 {
                        page
                    } else {
                        page + ((i as u64) << 32)
                    }
                })
                .collect())
        }
    }

    #[test]
    fn mapped_buffers_merge_contiguous_pages_and_split_the_rest() {
        let dma = ScatteredDma {
            inner: ProcessDma::new(1 << 20).unwrap(),
        };
        let mapped = MappedBuffer::alloc(&dma, 3 * PAGE_SIZE + 100).unwrap();
        let first = mapped.segments[0].addr;
        assert_eq!(mapped.segments.len(), 3);
        assert_eq!(mapped.segments[0].len, 2 * PAGE_SIZE as u32);
        assert_eq!(mapped.segments[1].len, PAGE_SIZE as u32);
        assert_eq!(mapped.segments[2].len, 100);
        assert_ne!(mapped.segments[1].addr, first + 2 * PAGE_SIZE as u64);

        let mut chain = Vec::new();
        mapped.range_into(0, PAGE_SIZE + 1, &mut chain);
        assert_eq!(
            chain,
            vec![Buffer {
                addr: first,
                len: PAGE_SIZE as u32 + 1
            }]
        );
        chain.clear();
        mapped.range_into(0, 2 * PAGE_SIZE + 5, &mut chain);
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1].len, 5);
    }

    /// A queue signal whose device is the test: notifications are counted for the device's
    /// side to wait on, and the device's interrupts wake the driver.
    #[derive(Default)]
    struct TestSignal {
        kicks: Mutex<u64>,
        kicked: Condvar,
        interrupts: Mutex<u64>,
        interrupted: Condvar,
    }

    /// Bounds a wait that only a bug makes long.
    const HANG: Duration = Duration::from_secs(60);

    impl TestSignal {
        fn interrupt(&self) {
            *self.interrupts.lock() += 1;
            self.interrupted.notify_all();
        }
    }

    impl QueueSignal for Arc<TestSignal> {
        type Ticket = u64;

        fn notify(&self) -> Result<(), TransportError> {
            *self.kicks.lock() += 1;
            self.kicked.notify_all();
            Ok(())
        }

        fn arm(&self) -> u64 {
            *self.interrupts.lock()
        }

        fn wait(&self, seen: u64, deadline: Option<Instant>) -> Result<bool, TransportError> {
            let mut interrupts = self.interrupts.lock();
            while *interrupts == seen {
                let deadline = deadline.unwrap_or_else(|| Instant::now() + HANG);
                if self
                    .interrupted
                    .wait_until(&mut interrupts, deadline)
                    .timed_out()
                {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    }

    /// The device's side: the next chain the driver makes available, waiting for its
    /// notification (EVENT_IDX: asking for one at the next entry before sleeping).
    fn next_chain(device: &mut RingDevice, signal: &TestSignal) -> SeenChain {
        let deadline = Instant::now() + HANG;
        loop {
            let kicks = *signal.kicks.lock();
            device.set_avail_event(device.next_avail());
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            if let Some(chain) = device.pop() {
                return chain;
            }
            let mut now = signal.kicks.lock();
            while *now == kicks {
                assert!(
                    !signal.kicked.wait_until(&mut now, deadline).timed_out(),
                    "no command became available"
                );
            }
        }
    }

    /// Answers a command chain with its request bytes reversed, interrupting if the driver
    /// asked for it.
    fn answer_reversed(device: &mut RingDevice, signal: &TestSignal, (head, chain): &SeenChain) {
        let request: Vec<u8> = chain
            .iter()
            .filter(|(_, _, flags)| flags & 2 == 0)
            .flat_map(|&(addr, len, _)| device.read(addr, len))
            .rev()
            .collect();
        let &(response, capacity, _) = chain.iter().find(|(_, _, flags)| flags & 2 != 0).unwrap();
        assert!(request.len() <= capacity as usize);
        device.write(response, &request);
        if device.push_used(u32::from(*head), request.len() as u32) {
            signal.interrupt();
        }
    }

    /// A control channel over an eight-entry queue with EVENT_IDX, its memory, its signal and
    /// the test's side of its device.
    fn test_channel() -> (
        ProcessDma,
        Arc<TestSignal>,
        ControlChannel<Arc<TestSignal>>,
        RingDevice,
    ) {
        let dma = ProcessDma::new(1 << 20).unwrap();
        let signal = Arc::new(TestSignal::default());
        let queue = SplitQueue::new(&dma, 8, true).unwrap();
        let device = RingDevice::new(dma.guest_ram(), &queue);
        let vq = SignalledQueue {
            queue,
            signal: Arc::clone(&signal),
        };
        let channel = ControlChannel::new(&dma, vq, HANG, AdaptiveSpin::new(Duration::ZERO));
        (dma, signal, channel.unwrap(), device)
    }

    #[test]
    fn commands_of_several_threads_are_in_flight_at_once_and_each_gets_its_answer() {
        let (dma, signal, channel, mut device) = test_channel();
        std::thread::scope(|scope| {
            let run = |request: &'static [u8]| {
                let (channel, dma) = (&channel, &dma);
                scope.spawn(move || {
                    let mut response = [0u8; 16];
                    let len = channel.round_trip(dma, request, &mut response).unwrap();
                    response[..len].to_vec()
                })
            };
            let first = run(b"first");
            let second = run(b"second!");
            // Both commands are available before either is answered: one thread's command
            // does not wait for the other's round trip (with one command at a time, the
            // second never comes and this fails after HANG).
            let a = next_chain(&mut device, &signal);
            let b = next_chain(&mut device, &signal);
            // Answered in the opposite order, and the older one only once the newer one's
            // caller has returned: the older one's caller, which waits for the device, is
            // woken by the first answer whatever it is and hands the newer one's on.
            answer_reversed(&mut device, &signal, &b);
            let (later, earlier) = if a.1[0].1 == 5 {
                (second, first)
            } else {
                (first, second)
            };
            let later_answer = later.join().unwrap();
            answer_reversed(&mut device, &signal, &a);
            let earlier_answer = earlier.join().unwrap();
            let mut answers = [later_answer, earlier_answer];
            answers.sort();
            assert_eq!(answers, [b"!dnoces".to_vec(), b"tsrif".to_vec()]);
        });
        // Every chain came back and the buffers of both callers are pooled for reuse.
        let state = channel.state.lock();
        assert_eq!(state.in_flight, 0);
        assert_eq!(state.queue.num_free(), 8);
        assert_eq!(state.idle.len(), 2);
        assert!(state.chains.iter().all(Option::is_none));
        assert!(state.answered.is_empty());
    }

    /// A batch of `count` three-byte commands (two descriptors each), `tag` in every byte;
    /// returns the used lengths and the answers.
    fn batch(
        channel: &ControlChannel<Arc<TestSignal>>,
        dma: &ProcessDma,
        tag: u8,
        count: usize,
    ) -> (Vec<usize>, Vec<[u8; 8]>) {
        let requests = vec![[tag; 3]; count];
        let mut responses = vec![[0u8; 8]; count];
        let mut commands: Vec<(&[u8], &mut [u8])> = requests
            .iter()
            .map(|r| &r[..])
            .zip(responses.iter_mut().map(|r| &mut r[..]))
            .collect();
        let used = channel.round_trip_batch(dma, &mut commands).unwrap();
        (used, responses)
    }

    #[test]
    fn a_batch_larger_than_the_queue_goes_out_in_parts() {
        let (dma, signal, channel, mut device) = test_channel();
        std::thread::scope(|scope| {
            // Eight commands of two descriptors each fill the eight-entry queue twice over.
            let caller = scope.spawn(|| batch(&channel, &dma, 7, 8));
            for _ in 0..8 {
                let chain = next_chain(&mut device, &signal);
                answer_reversed(&mut device, &signal, &chain);
            }
            assert_eq!(caller.join().unwrap().0, vec![3; 8]);
        });
    }

    #[test]
    fn commands_wait_for_descriptors_other_callers_hold() {
        let (dma, signal, channel, mut device) = test_channel();
        std::thread::scope(|scope| {
            // Four commands take the whole queue; whichever caller comes second waits for
            // descriptors until the device answers the first one's chains.
            let four = scope.spawn(|| batch(&channel, &dma, 4, 4));
            let one = scope.spawn(|| batch(&channel, &dma, 1, 1));
            let mut seen = Vec::new();
            while seen.len() < 4 {
                seen.push(next_chain(&mut device, &signal));
            }
            for chain in &seen {
                answer_reversed(&mut device, &signal, chain);
            }
            let last = next_chain(&mut device, &signal);
            answer_reversed(&mut device, &signal, &last);
            let (used, answers) = four.join().unwrap();
            assert_eq!(used, vec![3; 4]);
            assert!(answers.iter().all(|a| a[..3] == [4; 3]));
            let (used, answers) = one.join().unwrap();
            assert_eq!((used, &answers[0][..3]), (vec![3], &[1u8; 3][..]));
        });
    }

    #[test]
    fn an_answer_stays_with_its_command_when_another_chain_takes_its_head() {
        let (dma, signal, channel, mut device) = test_channel();
        let mut state = channel.state.lock();
        let (mut first_response, mut second_response) = ([0u8; 8], [0u8; 8]);
        let first: [(&[u8], &mut [u8]); 1] = [(b"first", &mut first_response)];
        let second: [(&[u8], &mut [u8]); 1] = [(b"second", &mut second_response)];
        let mut first_buffers = CommandBuffers::alloc(&dma, PAGE_SIZE, PAGE_SIZE).unwrap();
        let mut second_buffers = CommandBuffers::alloc(&dma, PAGE_SIZE, PAGE_SIZE).unwrap();
        let (mut first_sent, _) = state.publish(&mut first_buffers, &first, 0, 0).unwrap();
        let chain = device.pop().unwrap();
        answer_reversed(&mut device, &signal, &chain);
        assert!(state.collect_used().unwrap());
        // Collected, not yet taken by its caller: the head's descriptors are free, and the
        // next chain takes them.
        let (mut second_sent, _) = state.publish(&mut second_buffers, &second, 0, 0).unwrap();
        assert_eq!(device.pop().unwrap().0, chain.0);
        let mut used_lens = [0usize];
        state
            .take_answers(&mut second_sent, &second, &mut used_lens)
            .unwrap();
        assert_eq!(second_sent.len(), 1, "the second command has no answer yet");
        state
            .take_answers(&mut first_sent, &first, &mut used_lens)
            .unwrap();
        assert!(first_sent.is_empty());
        assert_eq!(used_lens, [5]);
    }

    #[test]
    fn a_batch_whose_later_command_cannot_go_fails_after_the_earlier_ones_are_answered() {
        let dma = ScatteredDma {
            inner: ProcessDma::new(1 << 20).unwrap(),
        };
        let signal = Arc::new(TestSignal::default());
        let queue = SplitQueue::new(&dma.inner, 8, true).unwrap();
        let mut device = RingDevice::new(dma.inner.guest_ram(), &queue);
        let vq = SignalledQueue {
            queue,
            signal: Arc::clone(&signal),
        };
        let channel =
            ControlChannel::new(&dma, vq, HANG, AdaptiveSpin::new(Duration::ZERO)).unwrap();
        std::thread::scope(|scope| {
            let caller = scope.spawn(|| {
                // The second request spans ten scattered pages: more descriptors than the
                // queue has.
                let big = vec![1u8; 10 * PAGE_SIZE];
                let (mut small_response, mut big_response) = ([0u8; 8], [0u8; 8]);
                let mut batch: [(&[u8], &mut [u8]); 2] =
                    [(b"small", &mut small_response), (&big, &mut big_response)];
                let failed = channel.round_trip_batch(&dma, &mut batch);
                assert!(matches!(failed, Err(TransportError::InvalidRequest(_))));
                assert_eq!(&small_response[..5], b"llams");
                // The channel is whole: the next command goes through.
                let mut response = [0u8; 8];
                assert_eq!(channel.round_trip(&dma, b"next", &mut response).unwrap(), 4);
            });
            for _ in 0..2 {
                let chain = next_chain(&mut device, &signal);
                answer_reversed(&mut device, &signal, &chain);
            }
            caller.join().unwrap();
        });
    }

    #[test]
    fn a_caller_gives_up_after_its_timeout_and_the_channel_stays_broken() {
        let dma = ProcessDma::new(1 << 20).unwrap();
        let signal = Arc::new(TestSignal::default());
        let queue = SplitQueue::new(&dma, 8, true).unwrap();
        let vq = SignalledQueue {
            queue,
            signal: Arc::clone(&signal),
        };
        let channel =
            ControlChannel::new(&dma, vq, Duration::ZERO, AdaptiveSpin::new(Duration::ZERO))
                .unwrap();
        let mut response = [0u8; 4];
        assert!(matches!(
            channel.round_trip(&dma, b"x", &mut response),
            Err(TransportError::Timeout(_))
        ));
        assert!(matches!(
            channel.round_trip(&dma, b"x", &mut response),
            Err(TransportError::DeviceFailure(_))
        ));
    }

    #[test]
    fn the_spin_follows_the_typical_round_trip_up_to_its_cap() {
        let us = Duration::from_micros;
        let mut spin = AdaptiveSpin::new(us(500));
        assert_eq!(
            spin.budget(1),
            Duration::ZERO,
            "nothing known: sleep at once"
        );
        for _ in 0..64 {
            spin.record(us(100), 1);
        }
        // The average converges on 100 µs; one and a half of it is polled.
        let budget = spin.budget(1);
        assert!(budget > us(145) && budget <= us(150), "{budget:?}");
        // A batch of three polls for three, up to the cap.
        assert!(spin.budget(3) > us(435) && spin.budget(3) <= us(450));
        assert_eq!(spin.budget(4), us(500));
        // A batch counts per command.
        spin.record(us(800), 8);
        assert!(spin.budget(1) <= us(150));
        // A long command raises the budget by an eighth of its excess, never past the cap.
        spin.record(Duration::from_secs(1), 1);
        assert_eq!(spin.budget(1), us(500));
        assert_eq!(AdaptiveSpin::new(Duration::ZERO).budget(1), Duration::ZERO);
    }
}
