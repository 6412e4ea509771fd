//! Completions: status and opcode as found in native CQEs (unknown values kept), the
//! work-completion flags and the ARM_CQ flags.

/// Defines a completion enum whose raw value comes from shared memory: every known value has
/// a variant, any other value is kept in `Other` instead of being trusted or dropped.
macro_rules! completion_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $value:expr,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A value this library does not know.
            Other(u32),
        }

        impl $name {
            /// Decodes the raw value found in a completion.
            pub const fn from_raw(raw: u32) -> Self {
                match raw {
                    $($value => $name::$variant,)+
                    other => $name::Other(other),
                }
            }

            /// The raw (`ibv_*`) value.
            pub const fn raw(self) -> u32 {
                match self {
                    $($name::$variant => $value,)+
                    $name::Other(other) => other,
                }
            }
        }
    };
}

completion_enum! {
    /// Completion status (`ibv_wc_status`), as found in native CQEs.
    pub enum WcStatus {
        /// Success.
        #[default]
        Success = 0,
        /// Local length error.
        LocLenErr = 1,
        /// Local QP operation error.
        LocQpOpErr = 2,
        /// Local EE context operation error.
        LocEecOpErr = 3,
        /// Local protection error.
        LocProtErr = 4,
        /// Flushed: the QP entered the error state.
        WrFlushErr = 5,
        /// Memory-window bind error.
        MwBindErr = 6,
        /// Bad response.
        BadRespErr = 7,
        /// Local access error.
        LocAccessErr = 8,
        /// Remote invalid request.
        RemInvReqErr = 9,
        /// Remote access error.
        RemAccessErr = 10,
        /// Remote operation error.
        RemOpErr = 11,
        /// Transport retry counter exceeded.
        RetryExcErr = 12,
        /// RNR retry counter exceeded.
        RnrRetryExcErr = 13,
        /// Local RDD violation.
        LocRddViolErr = 14,
        /// Remote invalid RD request.
        RemInvRdReqErr = 15,
        /// Remote aborted.
        RemAbortErr = 16,
        /// Invalid EE context number.
        InvEecnErr = 17,
        /// Invalid EE context state.
        InvEecStateErr = 18,
        /// Fatal error.
        FatalErr = 19,
        /// Response timeout.
        RespTimeoutErr = 20,
        /// General error.
        GeneralErr = 21,
    }
}

completion_enum! {
    /// Completion opcode (`ibv_wc_opcode`), as found in native CQEs. Only meaningful when the
    /// status is success.
    pub enum WcOpcode {
        /// Send.
        #[default]
        Send = 0,
        /// RDMA write.
        RdmaWrite = 1,
        /// RDMA read.
        RdmaRead = 2,
        /// Compare and swap.
        CompSwap = 3,
        /// Fetch and add.
        FetchAdd = 4,
        /// Memory-window bind.
        BindMw = 5,
        /// Local invalidate.
        LocalInv = 6,
        /// TCP segmentation offload.
        Tso = 7,
        /// Flush.
        Flush = 8,
        /// Atomic write.
        AtomicWrite = 9,
        /// Receive (test `raw() & 128` for "any receive", as with ibverbs).
        Recv = 128,
        /// Receive of an RDMA write with immediate data.
        RecvRdmaWithImm = 129,
    }
}

/// ARM_CQ flags.
pub mod arm_flags {
    /// Notify only for solicited completions (`ibv_req_notify_cq(cq, 1)`).
    pub const SOLICITED_ONLY: u32 = 1 << 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_values_round_trip_and_keep_unknown_ones() {
        // ibv_wc_opcode values from rdma-core's verbs.h that the 6.1 uapi header lacks.
        assert_eq!(WcOpcode::from_raw(8), WcOpcode::Flush);
        assert_eq!(WcOpcode::from_raw(9), WcOpcode::AtomicWrite);
        assert_eq!(WcOpcode::from_raw(128), WcOpcode::Recv);
        assert_eq!(WcOpcode::from_raw(129), WcOpcode::RecvRdmaWithImm);
        assert_eq!(WcOpcode::from_raw(10), WcOpcode::Other(10));
        assert_eq!(WcStatus::from_raw(5), WcStatus::WrFlushErr);
        assert_eq!(WcStatus::from_raw(21), WcStatus::GeneralErr);
        assert_eq!(WcStatus::from_raw(22), WcStatus::Other(22));
        for raw in (0..300).chain([u32::MAX]) {
            assert_eq!(WcOpcode::from_raw(raw).raw(), raw);
            assert_eq!(WcStatus::from_raw(raw).raw(), raw);
        }
    }
}
