//! The `verbs_enum!` macro: how every closed verbs enum (one whose other raw values are
//! refused) is declared, with its conversions from raw values.

/// Declares a verbs enum from one list of `Variant = value`: the enum, with those
/// discriminants and the `repr` after its name, and the fallible conversion from that raw type
/// and from each `impl TryFrom<T>;` listed after the enum. A conversion hands back the raw
/// value it rejects.
macro_rules! verbs_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $repr:ident {
            $($(#[$vmeta:meta])* $variant:ident = $value:literal,)+
        }
        $($(#[$imeta:meta])* impl TryFrom<$wider:ident>;)*
    ) => {
        $(#[$meta])*
        #[repr($repr)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $value,)+
        }

        verbs_enum!(@conversions $name { $($variant = $value),+ } $repr $($(#[$imeta])* $wider)*);
    };
    (@conversions $name:ident $variants:tt $($(#[$imeta:meta])* $raw:ident)+) => {
        $(verbs_enum!(@try_from $(#[$imeta])* $name: $raw $variants);)+
    };
    (
        @try_from $(#[$imeta:meta])* $name:ident: $raw:ident
        { $($variant:ident = $value:literal),+ }
    ) => {
        $(#[$imeta])*
        impl TryFrom<$raw> for $name {
            type Error = $raw;
            fn try_from(v: $raw) -> Result<Self, $raw> {
                match v {
                    $($value => Ok($name::$variant),)+
                    v => Err(v),
                }
            }
        }
    };
}
