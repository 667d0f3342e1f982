//! Checking a `#[sharded]` struct: every field has one `#[shard]`, is a
//! `ShardedArray`, agrees with its attribute, and all fields share a group.

use syn::{Fields, GenericArgument, ItemStruct, PathArguments, Type};

use crate::attr::{FieldSpec, Placement};

/// A field ready for expansion.
pub struct ShardField {
    pub ident: syn::Ident,
    pub spec: FieldSpec,
    /// The placement type as written in the field's type, e.g. `Sharded<1>`.
    pub placement_ty: Type,
    /// The group type: the field type's second argument, or `Group`.
    pub comm_ty: Option<Type>,
    /// A `QuantizedArray` field (a quantized `[out, in]` weight).
    pub quantized: bool,
}

/// The last path segment of `ty` and its first generic argument when that
/// is an integer literal: `Mesh<4>` -> `("Mesh", Some(4))`.
fn name_and_literal(ty: &Type) -> Option<(String, Option<usize>)> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    let literal = match &last.arguments {
        PathArguments::AngleBracketed(args) => match args.args.first() {
            Some(GenericArgument::Const(syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(i),
                ..
            }))) => i.base10_parse().ok(),
            _ => None,
        },
        _ => None,
    };
    Some((last.ident.to_string(), literal))
}

/// `N` of a `Mesh<N>` or an `Axis<A, N>` (a mesh axis of `N` ranks)
/// written with a literal.
pub fn mesh_size(ty: &Type) -> Option<usize> {
    let Type::Path(path) = ty else { return None };
    match size_argument(path.path.segments.last()?)? {
        GenericArgument::Const(syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        })) => i.base10_parse().ok(),
        _ => None,
    }
}

/// The size argument of a group type: `N` of `Mesh<N>` (the first) or of
/// `Axis<A, N>` (the second); `None` for other types.
pub fn size_argument(last: &syn::PathSegment) -> Option<&GenericArgument> {
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    if last.ident == "Mesh" {
        args.args.first()
    } else if last.ident == "Axis" {
        args.args.iter().nth(1)
    } else {
        None
    }
}

fn placement_of(ty: &Type) -> Option<Placement> {
    match name_and_literal(ty)? {
        (name, _) if name == "Replicated" => Some(Placement::Replicated),
        (name, axis) if name == "Sharded" => axis.map(Placement::Sharded),
        _ => None,
    }
}

/// `ShardedArray<P>` or `ShardedArray<P, C>` -> `(P, Some(C), false)`;
/// the same for `QuantizedArray`, with `true`.
fn sharded_array_args(ty: &Type) -> Option<(Type, Option<Type>, bool)> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    let quantized = last.ident == "QuantizedArray";
    if last.ident != "ShardedArray" && !quantized {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut types = args.args.iter().filter_map(|a| match a {
        GenericArgument::Type(t) => Some(t.clone()),
        _ => None,
    });
    let placement = types.next()?;
    Some((placement, types.next(), quantized))
}

pub fn placement_name(p: &Placement) -> String {
    match p {
        Placement::Replicated => "Replicated".into(),
        Placement::Sharded(a) => format!("Sharded<{a}>"),
        Placement::Partial => "Partial".into(),
    }
}

/// What a quantized field's attribute may not say: a quantized weight is
/// `[out, in]`, sharded whole (no fused segments).
fn quantized_field_error(ident: &syn::Ident, spec: &FieldSpec) -> Option<String> {
    if let Placement::Sharded(axis) = spec.placement {
        if axis > 1 {
            return Some(format!("field `{ident}` is a quantized `[out, in]` weight: it is `Replicated`, `Sharded<0>` (outputs) or `Sharded<1>` (inputs), not `Sharded<{axis}>`"));
        }
    }
    if spec.segments.is_some_and(|s| s.0 != 1) {
        return Some(format!("field `{ident}` is a quantized weight: `segments` (fused blocks) applies to `ShardedArray` fields only"));
    }
    match &spec.dims {
        Some(dims) if dims.len() != 2 => Some(format!(
            "field `{ident}` is a quantized `[out, in]` weight: its `dims` has 2 entries, not {}",
            dims.len()
        )),
        _ => None,
    }
}

/// Checks `item` and collects its fields; all errors are combined.
pub fn struct_fields(item: &mut ItemStruct) -> syn::Result<Vec<ShardField>> {
    let Fields::Named(named) = &mut item.fields else {
        return Err(syn::Error::new_spanned(
            &item.ident,
            "#[sharded] applies to structs with named fields, one weight per field",
        ));
    };
    let mut errors: Option<syn::Error> = None;
    let mut push = |e: syn::Error| match errors.as_mut() {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    let mut fields = Vec::new();
    for field in named.named.iter_mut() {
        let ident = field.ident.clone().expect("named field");
        let (shard_attrs, others): (Vec<_>, Vec<_>) = field
            .attrs
            .drain(..)
            .partition(|a| a.path().is_ident("shard"));
        field.attrs = others;
        let spec = match shard_attrs.as_slice() {
            [] => {
                push(syn::Error::new_spanned(
                    &ident,
                    format!("field `{ident}` has no `#[shard(...)]`: every field of a #[sharded] struct states its placement, e.g. `#[shard(Sharded<1>)]`"),
                ));
                continue;
            }
            [attr] => match attr.parse_args::<FieldSpec>() {
                Ok(spec) => spec,
                Err(e) => {
                    push(e);
                    continue;
                }
            },
            [_, second, ..] => {
                push(syn::Error::new_spanned(
                    second,
                    format!("field `{ident}` has more than one `#[shard(...)]`"),
                ));
                continue;
            }
        };
        let Some((placement_ty, comm_ty, quantized)) = sharded_array_args(&field.ty) else {
            push(syn::Error::new_spanned(
                &field.ty,
                format!("a #[shard] field must be a `ShardedArray<P>` or a `QuantizedArray<P>` (or with a group type `C`); field `{ident}` is not"),
            ));
            continue;
        };
        if placement_of(&placement_ty).as_ref() != Some(&spec.placement) {
            push(syn::Error::new_spanned(
                &placement_ty,
                format!(
                    "field `{ident}` is declared `#[shard({})]` but its type's placement is `{}`; make them agree",
                    placement_name(&spec.placement),
                    quote::ToTokens::to_token_stream(&placement_ty).to_string().replace(' ', "")
                ),
            ));
            continue;
        }
        if quantized {
            if let Some(message) = quantized_field_error(&ident, &spec) {
                push(syn::Error::new_spanned(&field.ty, message));
                continue;
            }
        }
        if let (Some(dims), Placement::Sharded(axis)) = (&spec.dims, &spec.placement) {
            if *axis >= dims.len() {
                push(syn::Error::new(
                    dims.last().map_or(proc_macro2::Span::call_site(), |d| d.1),
                    format!("field `{ident}` is Sharded<{axis}> but `dims` has {} dimensions: axis {axis} is out of range", dims.len()),
                ));
                continue;
            }
            let n = comm_ty.as_ref().and_then(mesh_size);
            let k = spec.segments.map_or(1, |s| s.0).max(1);
            if let Some(n) = n {
                let (size, span) = dims[*axis];
                if size % (n * k) != 0 {
                    push(syn::Error::new(
                        span,
                        format!(
                            "field `{ident}`: dimension {size} is sharded over a mesh of {n} ranks{}, which does not divide it",
                            if k > 1 { format!(" in {k} segments") } else { String::new() }
                        ),
                    ));
                    continue;
                }
            }
        }
        if let Some((k, span)) = spec.segments {
            if k == 0 {
                push(syn::Error::new(span, "`segments` must be at least 1"));
                continue;
            }
            if spec.placement == Placement::Replicated && k > 1 {
                push(syn::Error::new(
                    span,
                    "`segments` splits a sharded axis: it applies to `Sharded<AXIS>` fields only",
                ));
                continue;
            }
        }
        fields.push(ShardField {
            ident,
            spec,
            placement_ty,
            comm_ty,
            quantized,
        });
    }
    let first_comm = fields.first().map(|f| f.comm_ty.clone());
    for field in &fields {
        let same = match (&field.comm_ty, first_comm.as_ref().and_then(Option::as_ref)) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                quote::ToTokens::to_token_stream(a).to_string()
                    == quote::ToTokens::to_token_stream(b).to_string()
            }
            _ => false,
        };
        if !same {
            push(syn::Error::new_spanned(
                &field.ident,
                format!("field `{}` is laid out over another group type than the first field; all weights of a layer share one group", field.ident),
            ));
        }
    }
    match errors {
        Some(e) => Err(e),
        None => Ok(fields),
    }
}
