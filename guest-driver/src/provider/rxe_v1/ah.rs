//! What a UD send needs of an address handle.

use vrdma_spec::rxe_v1::RxeAv;

/// An address handle created on the device, as its CREATE_AH response describes it.
///
/// Kernels since 5.10 return a non-zero `ah_num` that a UD send names; older kernels return 0
/// and expect the address vector (`struct rxe_av`) copied into every UD send instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxeAddressHandle {
    /// What a UD WQE carries in `wr.ud.ah_num`: the kernel's AH index (0 on kernels that want
    /// the address vector inline), or, with `VRDMA_F_UD_STAGED_SQ`, the device's AH handle,
    /// which the device translates when it copies the WQE to the host (spec §9.6).
    pub ah_num: u32,
    /// The kernel's `struct rxe_av` for this handle.
    pub av: RxeAv,
}
