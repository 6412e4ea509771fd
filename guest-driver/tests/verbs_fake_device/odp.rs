//! On-demand paging: an `ON_DEMAND` registration reaches the device only where `VRDMA_F_ODP`
//! was negotiated, and the capabilities the configuration space describes are the context's.

use vrdma::dma::PAGE_SIZE;
use vrdma::spec::config::OdpCaps;
use vrdma::spec::control::Opcode;
use vrdma::spec::features;
use vrdma::verbs::{AccessFlags, VerbsError};
use vrdma::Context;
use vrdma_test_support::fake_transport::{default_config, FakeTransport, ODP_RC_CAPS};

use super::helpers::*;

#[test]
fn an_on_demand_registration_needs_the_feature() {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::ON_DEMAND;

    let (t, ctx) = open();
    assert_eq!(
        ctx.odp_caps(),
        Some(OdpCaps {
            rc: ODP_RC_CAPS,
            uc: 0,
            ud: 0b11
        })
    );
    let pd = ctx.alloc_pd().unwrap();
    let buf = ctx.alloc_buffer(PAGE_SIZE).unwrap();
    let mr = pd.register(&buf, access).unwrap();
    assert_eq!(t.device().mrs[&mr.handle()].access, access.bits());
    drop(mr);

    // Without VRDMA_F_ODP: no capabilities, and the registration is refused here, as rxe
    // without ODP refuses it (EOPNOTSUPP), with nothing sent.
    let transport = FakeTransport::with(default_config(), features::VRDMA_F_RING_RXE_V1);
    let ctx = Context::open(transport.clone()).unwrap();
    assert_eq!(ctx.odp_caps(), None);
    let pd = ctx.alloc_pd().unwrap();
    let buf = ctx.alloc_buffer(PAGE_SIZE).unwrap();
    assert!(matches!(
        pd.register(&buf, access),
        Err(VerbsError::Unsupported(_))
    ));
    assert!(!transport.device().ops().contains(&Opcode::RegMr));
    let mut mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    assert!(matches!(
        mr.rereg(vrdma::verbs::MrChange {
            access: Some(access),
            ..Default::default()
        }),
        Err(VerbsError::Unsupported(_))
    ));
}
