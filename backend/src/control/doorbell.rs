//! SET_DOORBELL_AREA (spec §5.3): the driver registers its doorbell area in guest RAM.

use vrdma_spec::features::VRDMA_F_DOORBELL_POLL;
use vrdma_spec::wire::SetDoorbellAreaReq;
use vrdma_spec::{ResponseBody, Status};

use super::error::CommandError;
use super::session::{CommandResult, Session};
use crate::datapath::doorbell::MappedArea;

/// SET_DOORBELL_AREA: `slots` must be the configured count; the area must lie in one RAM
/// region; it cannot be replaced while QPs exist.
pub(crate) fn set_doorbell_area(s: &mut Session<'_>, r: &SetDoorbellAreaReq) -> CommandResult {
    let slots = r.slots.get();
    let configured = s.guest.options().doorbell_slots();
    if slots != configured {
        return Err(CommandError::Invalid {
            what: "slots",
            value: slots.into(),
        });
    }
    if !s.state.qps.is_empty() {
        return Err(CommandError::Rule {
            what: "doorbell area in use by QPs",
            status: Status::Busy,
        });
    }
    let area = MappedArea::map(s.guest_io.memory().into_inner(), r.gpa.get(), slots)?;
    s.guest
        .doorbells()
        .lock()
        .install_area(area, s.features & VRDMA_F_DOORBELL_POLL != 0);
    Ok(ResponseBody::Empty)
}
