//! Events the device returns on the event queue (16 bytes each).

use zerocopy::IntoBytes;

use crate::config::exact;
use crate::error::DecodeError;
use crate::Le32;

wire_struct! {
    /// Wire form of one event.
    pub struct EventWire {
        /// [`EventType`].
        pub event_type: Le32,
        /// Object the event is about (see [`EventType::subject`]).
        pub handle: Le32,
        /// Type-specific detail (zero unless stated).
        pub detail: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(EventWire, 16, event_type @ 0, handle @ 4, detail @ 8, reserved @ 12);

/// Size of one event; every eventq buffer must be at least this large.
pub const EVENT_SIZE: usize = 16;

/// What an event's `handle` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject {
    /// A CQ handle.
    Cq,
    /// A QP handle.
    Qp,
    /// An SRQ handle.
    Srq,
    /// An MR handle.
    Mr,
    /// A port number.
    Port,
    /// Nothing (`handle` is 0).
    Device,
    /// A connection-manager id handle.
    CmId,
}

/// Event types. Values 2..=13 mirror `ibv_event_type` as noted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum EventType {
    /// A CQ armed with ARM_CQ received a (qualifying) completion. One per arm.
    Completion = 1,
    /// CQ overrun or error (`IBV_EVENT_CQ_ERR`).
    CqErr = 2,
    /// QP fatal error (`IBV_EVENT_QP_FATAL`).
    QpFatal = 3,
    /// Invalid request on the QP (`IBV_EVENT_QP_REQ_ERR`).
    QpReqErr = 4,
    /// Access violation on the QP (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessErr = 5,
    /// Communication established (`IBV_EVENT_COMM_EST`).
    CommEst = 6,
    /// Send queue drained (`IBV_EVENT_SQ_DRAINED`).
    SqDrained = 7,
    /// Last WQE reached on an SRQ-attached QP (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached = 8,
    /// SRQ error (`IBV_EVENT_SRQ_ERR`).
    SrqErr = 9,
    /// SRQ limit reached (`IBV_EVENT_SRQ_LIMIT_REACHED`); the limit disarms.
    SrqLimitReached = 10,
    /// Port became active (`IBV_EVENT_PORT_ACTIVE`).
    PortActive = 11,
    /// Port went down (`IBV_EVENT_PORT_ERR`).
    PortErr = 12,
    /// GID table changed (`IBV_EVENT_GID_CHANGE`).
    GidChange = 13,
    /// The device lost all guest state (host device failure, backend restart);
    /// `detail` is the new config `epoch`. The driver must reset the device.
    DeviceFatal = 14,
    /// Events were dropped because no eventq buffer was available; `detail` = count.
    EventsLost = 15,
    /// An MR was revoked because guest RAM under it was removed; handle = MR.
    MrRevoked = 16,
    /// A connection-manager event of a CM id is waiting for CM_GET_EVENT (`VRDMA_F_CM`);
    /// `detail` is the rdma_cm event number.
    CmEvent = 17,
}

impl EventType {
    /// Every event type.
    pub const ALL: [EventType; 17] = [
        EventType::Completion,
        EventType::CqErr,
        EventType::QpFatal,
        EventType::QpReqErr,
        EventType::QpAccessErr,
        EventType::CommEst,
        EventType::SqDrained,
        EventType::QpLastWqeReached,
        EventType::SrqErr,
        EventType::SrqLimitReached,
        EventType::PortActive,
        EventType::PortErr,
        EventType::GidChange,
        EventType::DeviceFatal,
        EventType::EventsLost,
        EventType::MrRevoked,
        EventType::CmEvent,
    ];

    /// What `handle` names for this type.
    pub const fn subject(self) -> Subject {
        match self {
            EventType::Completion | EventType::CqErr => Subject::Cq,
            EventType::QpFatal
            | EventType::QpReqErr
            | EventType::QpAccessErr
            | EventType::CommEst
            | EventType::SqDrained
            | EventType::QpLastWqeReached => Subject::Qp,
            EventType::SrqErr | EventType::SrqLimitReached => Subject::Srq,
            EventType::PortActive | EventType::PortErr | EventType::GidChange => Subject::Port,
            EventType::DeviceFatal | EventType::EventsLost => Subject::Device,
            EventType::MrRevoked => Subject::Mr,
            EventType::CmEvent => Subject::CmId,
        }
    }

    /// True if `detail` carries information for this type.
    pub const fn has_detail(self) -> bool {
        matches!(
            self,
            EventType::DeviceFatal | EventType::EventsLost | EventType::CmEvent
        )
    }
}

impl TryFrom<u32> for EventType {
    type Error = DecodeError;
    fn try_from(v: u32) -> Result<Self, DecodeError> {
        EventType::ALL
            .iter()
            .copied()
            .find(|t| *t as u32 == v)
            .ok_or(DecodeError::UnknownEventType(v))
    }
}

/// A decoded event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Type.
    pub event_type: EventType,
    /// CQ/QP/SRQ/MR handle, port number, or 0.
    pub handle: u32,
    /// Type-specific detail.
    pub detail: u32,
}

impl Event {
    /// Decodes the bytes the device wrote into one eventq buffer (exactly
    /// [`EVENT_SIZE`]). A driver that gets [`DecodeError::UnknownEventType`] from a
    /// newer device ignores the event.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let w: EventWire = exact(bytes)?;
        let event_type = EventType::try_from(w.event_type.get())?;
        if w.reserved.get() != 0 {
            return Err(DecodeError::Reserved("reserved"));
        }
        let handle = w.handle.get();
        let detail = w.detail.get();
        match event_type.subject() {
            Subject::Device if handle != 0 => Err(DecodeError::InvalidValue {
                field: "handle",
                value: handle.into(),
            }),
            Subject::Device => Ok(()),
            _ if handle == 0 => Err(DecodeError::InvalidValue {
                field: "handle",
                value: 0,
            }),
            _ => Ok(()),
        }?;
        if !event_type.has_detail() && detail != 0 {
            return Err(DecodeError::Reserved("detail"));
        }
        Ok(Event {
            event_type,
            handle,
            detail,
        })
    }

    /// Wire form.
    pub fn to_wire(&self) -> EventWire {
        EventWire {
            event_type: Le32::new(self.event_type as u32),
            handle: Le32::new(self.handle),
            detail: Le32::new(self.detail),
            reserved: Le32::ZERO,
        }
    }

    /// Encoded bytes.
    pub fn to_bytes(&self) -> [u8; EVENT_SIZE] {
        let mut b = [0u8; EVENT_SIZE];
        b.copy_from_slice(self.to_wire().as_bytes());
        b
    }
}
