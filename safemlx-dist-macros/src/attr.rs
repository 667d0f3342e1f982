//! Parsing `#[shard(...)]` field attributes.
//!
//! Grammar: `#[shard(PLACEMENT [, segments = K] [, dims = [D0, D1, ...]])]` where PLACEMENT is
//! `Replicated` or `Sharded<AXIS>`.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::{Ident, LitInt, Token};

/// A placement as written in an attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// `Replicated`.
    Replicated,
    /// `Sharded<AXIS>`.
    Sharded(usize),
    /// `Partial` (function specs only: a weight is never partial).
    Partial,
}

/// One parsed `#[shard(...)]`.
#[derive(Debug, Clone)]
pub struct FieldSpec {
    pub placement: Placement,
    pub segments: Option<(usize, Span)>,
    /// The full weight's shape, when declared: `dims = [4096, 11008]`.
    pub dims: Option<Vec<(usize, Span)>>,
}

pub const ACCEPTED_PLACEMENTS: &str = "expected a placement: `Replicated` or `Sharded<AXIS>`";
pub const ACCEPTED_KEYS: &str = "expected one of: `segments`, `dims`";

impl Parse for Placement {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input
            .parse()
            .map_err(|e| syn::Error::new(e.span(), ACCEPTED_PLACEMENTS))?;
        match name.to_string().as_str() {
            "Replicated" => Ok(Self::Replicated),
            "Sharded" => {
                let open: Option<Token![<]> = input.parse()?;
                if open.is_none() {
                    return Err(syn::Error::new_spanned(
                        &name,
                        "`Sharded` needs its axis: `Sharded<AXIS>`, e.g. `Sharded<1>`",
                    ));
                }
                let axis: LitInt = input.parse().map_err(|e| {
                    syn::Error::new(e.span(), "the axis of `Sharded<AXIS>` is an integer literal")
                })?;
                input.parse::<Token![>]>()?;
                Ok(Self::Sharded(axis.base10_parse()?))
            }
            "Partial" | "Ragged" => Err(syn::Error::new_spanned(
                &name,
                format!(
                    "a weight cannot be `{name}`: weights are `Replicated` or `Sharded<AXIS>` (a `Partial` or `Ragged` array is an activation)"
                ),
            )),
            _ => Err(syn::Error::new_spanned(&name, ACCEPTED_PLACEMENTS)),
        }
    }
}

impl Parse for FieldSpec {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let placement: Placement = input.parse()?;
        let mut segments = None;
        let mut dims = None;
        while input.parse::<Option<Token![,]>>()?.is_some() {
            if input.is_empty() {
                break;
            }
            let key: Ident = input.parse()?;
            let twice = || syn::Error::new_spanned(&key, format!("`{key}` is given twice"));
            if key == "segments" {
                if segments.is_some() {
                    return Err(twice());
                }
                input.parse::<Token![=]>()?;
                let value: LitInt = input.parse()?;
                segments = Some((value.base10_parse::<usize>()?, value.span()));
            } else if key == "dims" {
                if dims.is_some() {
                    return Err(twice());
                }
                input.parse::<Token![=]>()?;
                let content;
                syn::bracketed!(content in input);
                let values = content.parse_terminated(LitInt::parse, Token![,])?;
                dims = Some(
                    values
                        .iter()
                        .map(|v| Ok((v.base10_parse::<usize>()?, v.span())))
                        .collect::<syn::Result<Vec<_>>>()?,
                );
            } else {
                return Err(syn::Error::new_spanned(
                    &key,
                    format!("unknown key `{key}`; {ACCEPTED_KEYS}"),
                ));
            }
        }
        Ok(Self {
            placement,
            segments,
            dims,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(tokens: &str) -> syn::Result<FieldSpec> {
        syn::parse_str(tokens)
    }

    #[test]
    fn placements_and_segments_parse() {
        assert_eq!(
            parse("Replicated").unwrap().placement,
            Placement::Replicated
        );
        let spec = parse("Sharded<1>, segments = 3").unwrap();
        assert_eq!(spec.placement, Placement::Sharded(1));
        assert_eq!(spec.segments.map(|s| s.0), Some(3));
    }

    #[test]
    fn mistakes_are_explained() {
        let msg = |t: &str| parse(t).unwrap_err().to_string();
        assert_eq!(msg("Shardd<1>"), ACCEPTED_PLACEMENTS);
        assert!(msg("Sharded").contains("needs its axis"));
        assert!(msg("Partial").contains("a weight cannot be `Partial`"));
        assert_eq!(
            msg("Replicated, segs = 2"),
            "unknown key `segs`; expected one of: `segments`, `dims`"
        );
        assert_eq!(
            msg("Sharded<0>, segments = 2, segments = 3"),
            "`segments` is given twice"
        );
    }
}
