//! QP and address-handle attributes: typed setters and getters on [`crate::wire::QpAttr`] and [`crate::wire::AhAttr`].
