//! The control and event queues as every transport drives them; only how a queue is notified
//! and how the driver sleeps until the device used buffers differ ([`QueueSignal`]).
//!
//! Control commands: one chain per command (request bytes, then response bytes, each split
//! at the discontinuities of its DMA buffer), executed one at a time with a timeout, after
//! which the queue is considered broken: the device may still write into the buffers of a
//! chain it never returned, so they can never be reused. Events: a fixed set of
//! device-writable buffers kept posted, each re-posted once its event has been copied out.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::TransportError;
use crate::dma::{DmaBuffer, DmaMemory, PAGE_SIZE};
use crate::virtq::{Buffer, SplitQueue, UsedElement};

/// How a transport notifies one virtqueue and waits for the device to use its buffers.
pub(crate) trait QueueSignal: Send {
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

/// The control queue: synchronous commands, one at a time.
pub(crate) struct ControlChannel<S> {
    state: Mutex<ControlState<S>>,
    timeout: Duration,
}

struct ControlState<S> {
    vq: SignalledQueue<S>,
    request: MappedBuffer,
    response: MappedBuffer,
    /// Descriptors of the chain being built (kept to reuse its allocation).
    readable: Vec<Buffer>,
    writable: Vec<Buffer>,
    broken: bool,
    spin: AdaptiveSpin,
}

impl<S: QueueSignal> ControlChannel<S> {
    /// Drives the control queue `vq`; commands that take longer than `timeout` fail and
    /// leave the channel broken; `spin`: how its round trips wait for answers.
    pub(crate) fn new(
        dma: &dyn DmaMemory,
        vq: SignalledQueue<S>,
        timeout: Duration,
        spin: AdaptiveSpin,
    ) -> Result<Self, TransportError> {
        Ok(ControlChannel {
            state: Mutex::new(ControlState {
                vq,
                request: MappedBuffer::alloc(dma, PAGE_SIZE)?,
                response: MappedBuffer::alloc(dma, PAGE_SIZE)?,
                readable: Vec::new(),
                writable: Vec::new(),
                broken: false,
                spin,
            }),
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
        let mut used_lens = vec![0usize; commands.len()];
        let mut guard = self.state.lock();
        let control = &mut *guard;
        if control.broken {
            return Err(TransportError::DeviceFailure(
                "an earlier command never completed".into(),
            ));
        }
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
        control.reserve(dma, total_request, total_response)?;
        let mut next = 0;
        while next < commands.len() {
            next = control.run_batch(commands, next, &mut used_lens, self.timeout)?;
        }
        Ok(used_lens)
    }
}

impl<S: QueueSignal> ControlState<S> {
    /// Publishes the commands from `first` on, as many as the free descriptors take (at least
    /// one), notifies once and collects their answers. Returns the index of the first command
    /// not sent. Request and response bytes sit at the same offsets in the command buffers as
    /// in the whole batch.
    fn run_batch(
        &mut self,
        commands: &mut [(&[u8], &mut [u8])],
        first: usize,
        used_lens: &mut [usize],
        timeout: Duration,
    ) -> Result<usize, TransportError> {
        let request_offset: usize = commands[..first].iter().map(|(q, _)| q.len()).sum();
        let response_offset: usize = commands[..first].iter().map(|(_, r)| r.len()).sum();
        let (mut request_at, mut response_at) = (request_offset, response_offset);
        let mut heads: Vec<(u16, usize)> = Vec::new();
        let mut end = first;
        while end < commands.len() {
            let (request, response) = &commands[end];
            self.readable.clear();
            self.writable.clear();
            self.request
                .range_into(request_at, request.len(), &mut self.readable);
            self.response
                .range_into(response_at, response.len(), &mut self.writable);
            let needed = self.readable.len() + self.writable.len();
            if needed > usize::from(self.vq.queue.num_free()) {
                if heads.is_empty() {
                    return Err(TransportError::InvalidRequest(
                        "a command needs more descriptors than the control queue has",
                    ));
                }
                break;
            }
            self.request.buffer.as_mut_slice()[request_at..request_at + request.len()]
                .copy_from_slice(request);
            let head = self.vq.queue.add(&self.readable, &self.writable)?;
            heads.push((head, end));
            request_at += request.len();
            response_at += response.len();
            end += 1;
        }
        self.vq.notify_if_wanted()?;
        let sent = Instant::now();
        let deadline = sent + timeout;
        let in_flight = u32::try_from(heads.len()).unwrap_or(u32::MAX);
        let spin_until = Some(sent + self.spin.budget(in_flight));
        let mut done = 0;
        while done < heads.len() {
            // Fits: at most one chain per descriptor is in flight.
            let outstanding = (heads.len() - done) as u16;
            let used = match self
                .vq
                .next_used_of(outstanding, Some(deadline), spin_until)
            {
                Ok(Some(used)) => used,
                Ok(None) => {
                    self.broken = true;
                    return Err(TransportError::Timeout(timeout));
                }
                Err(e) => {
                    self.broken = true;
                    return Err(e);
                }
            };
            let Some(&(_, index)) = heads.iter().find(|(head, _)| *head == used.head) else {
                self.broken = true;
                return Err(TransportError::DeviceFailure(format!(
                    "control queue returned chain {}, which is not in flight",
                    used.head
                )));
            };
            let capacity = commands[index].1.len();
            if used.len as usize > capacity {
                self.broken = true;
                return Err(TransportError::DeviceFailure(format!(
                    "control queue returned {} bytes for a {capacity}-byte response",
                    used.len
                )));
            }
            used_lens[index] = used.len as usize;
            done += 1;
        }
        self.spin.record(sent.elapsed(), in_flight);
        let mut at = response_offset;
        for index in first..end {
            let response = &mut commands[index].1;
            let len = used_lens[index];
            response[..len].copy_from_slice(&self.response.buffer.as_slice()[at..at + len]);
            at += response.len();
        }
        Ok(end)
    }
}

impl<S> ControlState<S> {
    /// Makes the command buffers at least as large as this command needs.
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
    use super::*;
    use crate::dma::DmaError;
    use crate::transport::process::ProcessDma;

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
