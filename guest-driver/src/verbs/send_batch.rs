//! Send batches: a QP's send requests built piece by piece and posted together, the way
//! rdma-core's `ibv_wr_start` .. `ibv_wr_complete` does. The batch holds the QP's send lock
//! from [`Qp::send_batch`] until it is completed or dropped, writes each request straight into
//! the send queue ([`SendQueue::batch_add`] and the setters) and rings the doorbell once.

use parking_lot::MutexGuard;

use super::error::SendBatchError;
use super::qp::Qp;
use crate::provider::rxe_v1::{SendBatchState, SendQueue};
use crate::provider::{PostError, SendWr, Sge, UdDest};

/// An open send batch of a [`Qp`] (see [`Qp::send_batch`]). Other senders on the QP wait
/// until it is completed ([`Self::complete`]) or dropped (aborted: nothing of it is posted).
/// No allocation; the only device interaction is the doorbell of [`Self::complete`].
pub struct SendBatch<'a> {
    qp: &'a Qp,
    sq: MutexGuard<'a, SendQueue>,
    state: SendBatchState,
}

impl Qp {
    /// Opens a send batch (`ibv_wr_start`): the QP's send queue stays locked until the batch
    /// is completed or dropped.
    pub fn send_batch(&self) -> SendBatch<'_> {
        let sq = self.lock_send_queue();
        let state = sq.batch_begin();
        SendBatch {
            qp: self,
            sq,
            state,
        }
    }
}

impl SendBatch<'_> {
    /// Starts the next request: `wr`'s id, opcode, flags, immediate data and remote operands.
    /// Its payload (empty until then) and, on UD QPs, its destination come from the setters;
    /// `wr.sg_list` and `wr.ud` are not looked at.
    pub fn add(&mut self, wr: &SendWr<'_>) {
        self.sq.batch_add(&mut self.state, wr);
    }

    /// Makes `sges` the current request's payload (copied now).
    pub fn set_sges(&mut self, sges: &[Sge]) {
        self.sq.batch_set_sges(&mut self.state, sges);
    }

    /// Copies the bytes of `chunks` (start, length) in as the current request's inline
    /// payload.
    ///
    /// # Safety
    /// Each chunk is readable memory of this process for the duration of the call.
    pub unsafe fn set_inline(&mut self, chunks: impl Iterator<Item = (*const u8, usize)> + Clone) {
        // SAFETY: forwarded contract.
        unsafe { self.sq.batch_set_inline(&mut self.state, chunks) };
    }

    /// Sets the current request's destination (UD QPs).
    pub fn set_ud_dest(&mut self, dest: &UdDest<'_>) {
        self.sq.batch_set_ud_dest(&mut self.state, dest);
    }

    /// Refuses the current request for `error` (an operation this library cannot express):
    /// the batch fails.
    pub fn fail(&mut self, error: PostError) {
        self.state.fail(error);
    }

    /// The first refusal of the batch so far: the refused request's index and why.
    pub fn error(&self) -> Option<(usize, PostError)> {
        self.state.error()
    }

    /// Posts the batch (`ibv_wr_complete`) and releases the send queue: `Ok(n)` with the
    /// number of requests posted, the doorbell rung once if `n > 0`. If a request was refused,
    /// nothing of the batch is posted.
    pub fn complete(self) -> Result<usize, SendBatchError> {
        let SendBatch { qp, mut sq, state } = self;
        let published = sq.batch_publish(state);
        // Neither the kick nor the doorbell needs the queue lock: they only name the QP.
        drop(sq);
        let posted =
            published.map_err(|(index, error)| SendBatchError::Refused { index, error })?;
        if posted > 0 {
            qp.start_sending()
                .map_err(|source| SendBatchError::Doorbell { posted, source })?;
        }
        Ok(posted)
    }
}

impl std::fmt::Debug for SendBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBatch")
            .field("qp", &self.qp)
            .field("state", &self.state)
            .finish()
    }
}
