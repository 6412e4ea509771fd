//! Device, port and GID-table attributes: typed getters on [`crate::wire::DeviceAttr`], [`crate::wire::PortAttr`] and [`crate::wire::GidEntry`].
