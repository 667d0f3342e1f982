//! `#[sharded(...)]` on a function or method: check the specs against the
//! signature, then wrap the body so that each declared parameter is
//! converted into its declared placement on entry and the body's result
//! into the declared return placement, through the typed layer.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use syn::{FnArg, ItemFn, Pat, Type};

use crate::attr::Placement;
use crate::signature::{Dim, FnArgs, Spec};

fn combine_err(errors: &mut Option<syn::Error>, e: syn::Error) {
    match errors.as_mut() {
        Some(all) => all.combine(e),
        None => *errors = Some(e),
    }
}

/// The last path segment's name of `ty` (through one reference).
fn type_name(ty: &Type) -> Option<(String, bool, &syn::PathSegment)> {
    let (ty, by_ref) = match ty {
        Type::Reference(r) => (&*r.elem, true),
        other => (other, false),
    };
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    Some((last.ident.to_string(), by_ref, last))
}

/// `N` of a `Mesh<N>` / `&Mesh<N>` written with a literal.
fn mesh_size(ty: &Type) -> Option<usize> {
    match ty {
        Type::Reference(r) => crate::valid::mesh_size(&r.elem),
        other => crate::valid::mesh_size(other),
    }
}

fn placement_tokens(p: &Placement) -> TokenStream {
    match p {
        Placement::Replicated => quote!(::safemlx_dist::Replicated),
        Placement::Sharded(a) => quote!(::safemlx_dist::Sharded<#a>),
        Placement::Partial => quote!(::safemlx_dist::Partial),
    }
}

fn dims_text(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Dim::Lit(v, _) => v.to_string(),
            Dim::Sym(s) => s.to_string(),
            Dim::Bound(s, v, _) => format!("{s} = {v}"),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

fn dims_tokens(dims: &[Dim]) -> TokenStream {
    let items = dims.iter().map(|d| match d {
        Dim::Lit(v, _) | Dim::Bound(_, v, _) => quote!(::safemlx_dist::__private::Dim::Size(#v)),
        Dim::Sym(s) => {
            let name = s.to_string();
            quote!(::safemlx_dist::__private::Dim::Named(#name))
        }
    });
    quote!(&[#(#items),*])
}

/// Compile-time checks of one spec: the axis exists in the declared shape,
/// and a literal sharded dimension is divisible by a literal mesh size.
fn static_checks(spec: &Spec, mesh: Option<usize>, errors: &mut Option<syn::Error>) {
    let (Placement::Sharded(axis), Some(dims)) = (&spec.placement, &spec.dims) else {
        return;
    };
    let Some(dim) = dims.get(*axis) else {
        combine_err(
            errors,
            syn::Error::new(
                spec.placement_span,
                format!(
                    "axis {axis} is out of range for `{}`, declared with {} dimensions {}",
                    spec.name,
                    dims.len(),
                    dims_text(dims)
                ),
            ),
        );
        return;
    };
    if let (Dim::Lit(size, span) | Dim::Bound(_, size, span), Some(n)) = (dim, mesh) {
        if size % n != 0 {
            combine_err(
                errors,
                syn::Error::new(
                    *span,
                    format!("dimension {size} of `{}` is sharded over a mesh of {n} ranks, which does not divide it", spec.name),
                ),
            );
        }
    }
}

/// A name bound to a size (`D = 4096`) must have that size wherever the
/// attribute binds it again: the way to say that the inner dimensions of
/// two declared shapes agree (`x: [T, D = 4096]`, `w: [D = 4096, H]`).
fn bound_dims_agree(args: &FnArgs, errors: &mut Option<syn::Error>) {
    let mut seen: Vec<(String, usize, String)> = Vec::new();
    for spec in args.params.iter().chain(&args.ret) {
        for dim in spec.dims.iter().flatten() {
            let Dim::Bound(name, size, span) = dim else {
                continue;
            };
            let key = name.to_string();
            match seen.iter().find(|(n, _, _)| *n == key) {
                Some((_, first, owner)) if first != size => combine_err(
                    errors,
                    syn::Error::new(
                        *span,
                        format!(
                            "dimension `{key}` is {first} in `{owner}` but {size} in `{}`: declared shapes that share a dimension must agree",
                            spec.name
                        ),
                    ),
                ),
                Some(_) => {}
                None => seen.push((key, *size, spec.name.to_string())),
            }
        }
    }
}

/// The errors, then the function unchanged (so that IDEs keep working).
fn finish_with_errors(errors: Option<syn::Error>, func: ItemFn) -> TokenStream {
    let mut out = errors.map(|e| e.to_compile_error()).unwrap_or_default();
    out.extend(func.into_token_stream());
    out
}

/// Checks `args` against `func` and wraps its body.
pub fn expand(args: FnArgs, mut func: ItemFn) -> TokenStream {
    let mut errors = None;
    let params: Vec<(String, &Type)> = func
        .sig
        .inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Typed(t) => match &*t.pat {
                Pat::Ident(i) => Some((i.ident.to_string(), &*t.ty)),
                _ => None,
            },
            FnArg::Receiver(_) => None,
        })
        .collect();
    let names = params
        .iter()
        .map(|(n, _)| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let find = |name: &syn::Ident| params.iter().find(|(n, _)| name == n).map(|(_, t)| *t);
    let missing = |name: &syn::Ident| {
        syn::Error::new_spanned(
            name,
            format!("no parameter named `{name}`; the parameters are {names}"),
        )
    };

    let stream = match &args.stream {
        Some(name) => {
            if find(name).is_none() {
                combine_err(&mut errors, missing(name));
            }
            Some(name.clone())
        }
        None => params
            .iter()
            .find(|(_, ty)| type_name(ty).is_some_and(|(n, by_ref, _)| n == "Stream" && by_ref))
            .map(|(n, _)| syn::Ident::new(n, proc_macro2::Span::call_site())),
    };
    if stream.is_none() && errors.is_none() {
        combine_err(
            &mut errors,
            syn::Error::new_spanned(&func.sig.ident, "a #[sharded] function needs a `&Stream` parameter for the collectives it inserts (or name one with `stream = PARAM`)"),
        );
    }
    let mesh = match &args.mesh {
        Some(name) => match find(name) {
            Some(ty) => mesh_size(ty),
            None => {
                combine_err(&mut errors, missing(name));
                None
            }
        },
        None => None,
    };

    let mut checks = Vec::new();
    let mut conversions = Vec::new();
    for spec in &args.params {
        let Some(ty) = find(&spec.name) else {
            combine_err(&mut errors, missing(&spec.name));
            continue;
        };
        let Some((_, by_ref, _)) = type_name(ty).filter(|(n, _, _)| n == "ShardedArray") else {
            combine_err(
                &mut errors,
                syn::Error::new_spanned(
                    &spec.name,
                    format!(
                        "a placement is declared for `{}`, whose type `{}` is not a `ShardedArray`",
                        spec.name,
                        ty.to_token_stream().to_string().replace(' ', "")
                    ),
                ),
            );
            continue;
        };
        static_checks(spec, mesh, &mut errors);
        let name = &spec.name;
        let label = name.to_string();
        if let Some(dims) = &spec.dims {
            let text = dims_text(dims);
            let dims = dims_tokens(dims);
            checks.push(quote!(__dims.check(#label, #text, #name.global_shape(), #dims)?;));
        }
        let to = placement_tokens(&spec.placement);
        conversions.push(if by_ref {
            quote!(let #name = &::std::clone::Clone::clone(#name).redistribute::<#to>(#stream)?;)
        } else {
            quote!(let #name = #name.redistribute::<#to>(#stream)?;)
        });
    }
    if let Some(ret) = &args.ret {
        static_checks(ret, mesh, &mut errors);
    }
    bound_dims_agree(&args, &mut errors);
    // route(TOKENS, COUNTS): dispatch before the body, combine after it.
    let (dispatch, combine) = match &args.route {
        None => (None, None),
        Some((tokens, counts)) => {
            for name in [tokens, counts] {
                if find(name).is_none() {
                    combine_err(&mut errors, missing(name));
                }
            }
            let Some(mesh) = &args.mesh else {
                combine_err(&mut errors, syn::Error::new_spanned(tokens, "`route(...)` needs `mesh = PARAM`: the counts are exchanged over that group"));
                return finish_with_errors(errors, func);
            };
            // Spanned on `COUNTS`, so a count array of the wrong length is
            // reported there.
            let counts_ref = quote::quote_spanned!(counts.span()=> &#counts);
            (
                Some(quote! {
                    let __plan = ::safemlx_dist::typed::RoutingPlan::exchange(#mesh, #counts_ref, #stream)?;
                    let __unrouted = ::std::clone::Clone::clone(&#tokens);
                    let #tokens = #tokens.route(&__plan, #stream)?;
                }),
                Some(quote! {
                    let __out = __out.route_back(&__plan, &__unrouted, #stream)?;
                }),
            )
        }
    };
    if errors.is_some() {
        return finish_with_errors(errors, func);
    }

    let body = &func.block;
    let finish = match &args.ret {
        Some(ret) => {
            let to = placement_tokens(&ret.placement);
            let check = ret.dims.as_ref().map(|dims| {
                let text = dims_text(dims);
                let dims = dims_tokens(dims);
                quote!(__dims.check("return", #text, __out.global_shape(), #dims)?;)
            });
            quote! {
                let __out = __out.redistribute::<#to>(#stream)?;
                #check
                ::std::result::Result::Ok(__out)
            }
        }
        None => quote!(::std::result::Result::Ok(__out)),
    };
    let wrapped: syn::Block = syn::parse_quote!({
        #[allow(unused_mut)]
        let mut __dims = ::safemlx_dist::__private::Dims::default();
        #(#checks)*
        #(#conversions)*
        #dispatch
        #[allow(clippy::redundant_closure_call)]
        let __out = (|| -> ::safemlx_dist::Result<_> { #body })()?;
        #combine
        #finish
    });
    func.block = Box::new(wrapped);
    func.into_token_stream()
}
