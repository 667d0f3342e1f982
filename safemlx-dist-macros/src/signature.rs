//! Parsing the arguments of `#[sharded(...)]` on a function:
//! `mesh = IDENT`, `stream = IDENT`, `PARAM[: [DIMS]] @ PLACEMENT` and
//! `return[: [DIMS]] @ PLACEMENT`, separated by commas.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::{bracketed, Ident, LitInt, Token};

use crate::attr::Placement;

/// One dimension of a declared shape.
#[derive(Debug, Clone)]
pub enum Dim {
    /// A size known at compile time.
    Lit(usize, Span),
    /// A size named by a symbol, checked to agree wherever it appears.
    Sym(Ident),
    /// `NAME = SIZE`: a named size known at compile time; every use of the
    /// name in the attribute must agree with it (checked by the macro).
    Bound(Ident, usize, Span),
}

/// `x: [T, 4096] @ Replicated` or `return @ Sharded<0>`.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The parameter (or `return`).
    pub name: Ident,
    pub dims: Option<Vec<Dim>>,
    pub placement: Placement,
    pub placement_span: Span,
}

/// Everything between the parentheses of `#[sharded(...)]`.
#[derive(Debug, Default)]
pub struct FnArgs {
    pub mesh: Option<Ident>,
    pub stream: Option<Ident>,
    pub params: Vec<Spec>,
    pub ret: Option<Spec>,
    /// `route(TOKENS, COUNTS)`: rows of `TOKENS` are dispatched by the
    /// per-destination `COUNTS`, and the result is combined back.
    pub route: Option<(Ident, Ident)>,
}

pub const ACCEPTED: &str = "expected one of: `mesh = PARAM`, `stream = PARAM`, `route(TOKENS, COUNTS)`, `PARAM: [DIMS] @ PLACEMENT`, `return: [DIMS] @ PLACEMENT`";

fn parse_placement(input: ParseStream) -> syn::Result<(Placement, Span)> {
    let span = input.span();
    let fork = input.fork();
    let ident: Ident = fork.parse().map_err(|e| {
        syn::Error::new(
            e.span(),
            "expected a placement after `@`: `Replicated`, `Sharded<AXIS>` or `Partial`",
        )
    })?;
    if ident == "Partial" {
        input.parse::<Ident>()?;
        return Ok((Placement::Partial, span));
    }
    Ok((input.parse()?, span))
}

impl Parse for Dim {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(LitInt) {
            let lit: LitInt = input.parse()?;
            Ok(Self::Lit(lit.base10_parse()?, lit.span()))
        } else {
            let sym: Ident = input.parse().map_err(|e| {
                syn::Error::new(
                    e.span(),
                    "a dimension is an integer, a name, or `NAME = INTEGER`, e.g. `[T, D = 4096]`",
                )
            })?;
            if input.parse::<Option<Token![=]>>()?.is_some() {
                let lit: LitInt = input.parse()?;
                return Ok(Self::Bound(sym, lit.base10_parse()?, lit.span()));
            }
            Ok(Self::Sym(sym))
        }
    }
}

impl Parse for FnArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = Self::default();
        while !input.is_empty() {
            let name: Ident = if input.peek(Token![return]) {
                let kw: Token![return] = input.parse()?;
                Ident::new("return", kw.span)
            } else {
                input
                    .parse()
                    .map_err(|e| syn::Error::new(e.span(), ACCEPTED))?
            };
            if name == "route" && input.peek(syn::token::Paren) {
                let content;
                syn::parenthesized!(content in input);
                let tokens: Ident = content.parse()?;
                content.parse::<Token![,]>()?;
                let counts: Ident = content.parse()?;
                if args.route.is_some() {
                    return Err(syn::Error::new_spanned(&name, "`route` is given twice"));
                }
                args.route = Some((tokens, counts));
                if input.is_empty() {
                    break;
                }
                input.parse::<Token![,]>()?;
                continue;
            }
            if input.peek(Token![=]) {
                input.parse::<Token![=]>()?;
                let value: Ident = input.parse()?;
                let slot = match name.to_string().as_str() {
                    "mesh" => &mut args.mesh,
                    "stream" => &mut args.stream,
                    _ => {
                        return Err(syn::Error::new_spanned(
                            &name,
                            format!("unknown key `{name}`; {ACCEPTED}"),
                        ))
                    }
                };
                if slot.is_some() {
                    return Err(syn::Error::new_spanned(
                        &name,
                        format!("`{name}` is given twice"),
                    ));
                }
                *slot = Some(value);
            } else {
                let dims = if input.peek(Token![:]) {
                    input.parse::<Token![:]>()?;
                    let content;
                    bracketed!(content in input);
                    let dims = content.parse_terminated(Dim::parse, Token![,])?;
                    Some(dims.into_iter().collect())
                } else {
                    None
                };
                input.parse::<Token![@]>().map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        format!("expected `@ PLACEMENT` after `{name}`; {ACCEPTED}"),
                    )
                })?;
                let (placement, placement_span) = parse_placement(input)?;
                let spec = Spec {
                    name: name.clone(),
                    dims,
                    placement,
                    placement_span,
                };
                if name == "return" {
                    if args.ret.is_some() {
                        return Err(syn::Error::new_spanned(
                            &name,
                            "`return` is specified twice",
                        ));
                    }
                    args.ret = Some(spec);
                } else {
                    if args.params.iter().any(|p| p.name == name) {
                        return Err(syn::Error::new_spanned(
                            &name,
                            format!("parameter `{name}` is specified twice"),
                        ));
                    }
                    args.params.push(spec);
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_grammar_parses() {
        let args: FnArgs = syn::parse_str(
            "mesh = mesh, x: [T, 4096] @ Replicated, y @ Partial, return: [T, 4096] @ Sharded<0>",
        )
        .unwrap();
        assert_eq!(args.mesh.unwrap(), "mesh");
        assert_eq!(args.params.len(), 2);
        assert_eq!(args.params[1].placement, Placement::Partial);
        assert_eq!(args.ret.unwrap().placement, Placement::Sharded(0));
        let routed: FnArgs = syn::parse_str("mesh = m, route(tokens, counts)").unwrap();
        let (t, c) = routed.route.unwrap();
        assert_eq!(
            (t.to_string(), c.to_string()),
            ("tokens".into(), "counts".into())
        );
        let bound: FnArgs = syn::parse_str("x: [T, D = 4096] @ Replicated").unwrap();
        let dims = bound.params[0].dims.as_ref().unwrap();
        assert!(matches!(&dims[1], Dim::Bound(name, 4096, _) if name == "D"));
    }

    #[test]
    fn mistakes_are_explained() {
        let msg = |t: &str| syn::parse_str::<FnArgs>(t).unwrap_err().to_string();
        assert_eq!(msg("meshh = m"), format!("unknown key `meshh`; {ACCEPTED}"));
        assert_eq!(
            msg("x @ Replicated, x @ Replicated"),
            "parameter `x` is specified twice"
        );
        assert!(msg("x: [T] Replicated").starts_with("expected `@ PLACEMENT` after `x`"));
    }
}
