//! The `#[sharded]` attribute and `#[derive(Parameters)]` of `safemlx-dist`
//! (re-exported there as `safemlx_dist::sharded` and
//! `safemlx_dist::grad::Parameters`). This file holds only the entry point; parsing
//! (`attr.rs`), checking (`valid.rs`) and code generation (`expand.rs`) are
//! written against `proc_macro2` so they can be unit-tested.

mod attr;
mod expand;
mod function;
mod parameters;
mod signature;
mod valid;

use proc_macro::TokenStream;

/// Declares how a layer's weights are laid out across ranks.
///
/// On a struct with named fields, each field says its placement with
/// `#[shard(...)]`. On a function or method, `#[sharded(x: [T, D] @
/// Replicated, return: [T, D] @ Sharded<0>)]` converts the declared
/// parameters and the result into those placements, with shape checks. See
/// the book's "#[sharded]" chapter for the grammar and the code it expands to.
#[proc_macro_attribute]
pub fn sharded(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::sharded(attr.into(), item.into()).into()
}

/// Implements `safemlx_dist::grad::Parameters` for a composite model: a
/// struct's trainable arrays are its fields' in declaration order (a field
/// marked `#[parameters(skip)]`, such as a configuration, is cloned); an
/// enum's are those of the value its variant holds. Every other field must
/// implement `Parameters` itself.
#[proc_macro_derive(Parameters, attributes(parameters))]
pub fn derive_parameters(item: TokenStream) -> TokenStream {
    parameters::derive(item.into()).into()
}
