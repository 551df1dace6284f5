//! Small macros for value enums (named values plus `Other(raw)`) and flag newtypes.

macro_rules! value_enum {
    ($(#[$doc:meta])* $name:ident : $ty:ty { $($(#[$vdoc:meta])* $variant:ident = $val:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
            /// A value this version does not name, kept numerically.
            Other($ty),
        }
        impl $name {
            /// From the wire value.
            pub fn from_raw(v: $ty) -> Self {
                match v { $($val => Self::$variant,)* o => Self::Other(o) }
            }
            /// To the wire value.
            pub fn to_raw(self) -> $ty {
                match self { $(Self::$variant => $val,)* Self::Other(o) => o }
            }
        }
        impl From<$ty> for $name {
            fn from(v: $ty) -> Self { Self::from_raw(v) }
        }
        impl From<$name> for $ty {
            fn from(v: $name) -> $ty { v.to_raw() }
        }
    };
}

macro_rules! flags {
    ($(#[$doc:meta])* $name:ident : $ty:ty { $($(#[$vdoc:meta])* $flag:ident = $val:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        #[cfg_attr(feature = "serde", serde(transparent))]
        pub struct $name(pub $ty);
        impl $name {
            $($(#[$vdoc])* pub const $flag: $name = $name($val);)*
            /// No flags.
            pub const fn empty() -> Self { $name(0) }
            /// Raw bits.
            pub const fn bits(self) -> $ty { self.0 }
            /// All bits of `other` are set.
            pub const fn contains(self, other: $name) -> bool { self.0 & other.0 == other.0 }
            /// Set the bits of `other`.
            pub fn insert(&mut self, other: $name) { self.0 |= other.0 }
        }
        impl std::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, o: $name) -> $name { $name(self.0 | o.0) }
        }
        impl std::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, o: $name) { self.0 |= o.0 }
        }
    };
}
