//! Code generation for `#[sharded]`.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Item, ItemStruct};

use crate::valid::{struct_fields, ShardField};

/// The attribute's entry point: on error, the errors plus the original item
/// (with `#[shard]` attributes removed) so that IDEs and later errors keep
/// working.
pub fn sharded(attr: TokenStream, item: TokenStream) -> TokenStream {
    let parsed: Item = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(e) => return e.to_compile_error(),
    };
    match parsed {
        Item::Struct(mut item) => {
            let args_error = (!attr.is_empty()).then(|| {
                syn::Error::new_spanned(&attr, "#[sharded] on a struct takes no arguments; put each field's placement in `#[shard(...)]`")
            });
            match (struct_fields(&mut item), args_error) {
                (Ok(fields), None) => expand_struct(&item, &fields),
                (Ok(_), Some(e)) => with_item(e, &item),
                (Err(mut e), extra) => {
                    if let Some(extra) = extra {
                        e.combine(extra);
                    }
                    with_item(e, &item)
                }
            }
        }
        Item::Fn(func) => match syn::parse2::<crate::signature::FnArgs>(attr) {
            Ok(args) => crate::function::expand(args, func),
            Err(e) => {
                let mut out = e.to_compile_error();
                out.extend(quote!(#func));
                out
            }
        },
        other => {
            let error = syn::Error::new_spanned(
                &other,
                "#[sharded] applies to a struct whose fields are the layer's weights, or to a function whose parameters and result it lays out",
            );
            let mut out = error.to_compile_error();
            out.extend(quote!(#other));
            out
        }
    }
}

fn with_item(error: syn::Error, item: &ItemStruct) -> TokenStream {
    let mut out = error.to_compile_error();
    out.extend(quote!(#item));
    out
}

/// For a layer generic over `Mesh<N>` (or `Axis<A, N>`), the divisibility of a declared
/// sharded dimension by `N` is checked when the layer is instantiated
/// (a const assertion; literal mesh sizes are checked by the macro itself).
fn generic_mesh_check(field: &ShardField, dims: &[usize]) -> Option<TokenStream> {
    let crate::attr::Placement::Sharded(axis) = field.spec.placement else {
        return None;
    };
    let size = *dims.get(axis)?;
    let comm = field.comm_ty.as_ref()?;
    if crate::valid::mesh_size(comm).is_some() {
        return None;
    }
    let syn::Type::Path(path) = comm else {
        return None;
    };
    let n = crate::valid::size_argument(path.path.segments.last()?)?;
    let k = field.spec.segments.map_or(1, |s| s.0).max(1);
    let message = format!(
        "field `{}`: dimension {size} is sharded over the mesh, whose size does not divide it",
        field.ident
    );
    Some(quote!(const { assert!(#size % (#n * #k) == 0, #message) };))
}

fn expand_struct(item: &ItemStruct, fields: &[ShardField]) -> TokenStream {
    let name = &item.ident;
    let (impl_generics, ty_generics, where_clause) = item.generics.split_for_impl();
    let comm = fields
        .first()
        .and_then(|f| f.comm_ty.clone())
        .map(|c| quote!(#c))
        .unwrap_or_else(|| quote!(::safemlx_dist::Group));
    let idents: Vec<_> = fields.iter().map(|f| &f.ident).collect();
    let placements: Vec<_> = fields.iter().map(|f| &f.placement_ty).collect();
    let segments: Vec<usize> = fields
        .iter()
        .map(|f| f.spec.segments.map_or(1, |s| s.0))
        .collect();
    let names: Vec<String> = idents.iter().map(|i| i.to_string()).collect();
    let dim_checks = |from_checkpoint: bool| -> Vec<TokenStream> {
        fields
            .iter()
            .filter_map(|f| {
                let dims: Vec<usize> = f.spec.dims.as_ref()?.iter().map(|d| d.0).collect();
                let (ident, name) = (&f.ident, f.ident.to_string());
                let static_check = generic_mesh_check(f, &dims);
                if from_checkpoint {
                    // `load_fields` checks the shapes as it reads them.
                    return static_check;
                }
                let shape = if f.quantized {
                    quote!(&#ident.shape().map(|d| d as i32))
                } else {
                    quote!(#ident.shape())
                };
                Some(quote! {
                    #static_check
                    ::safemlx_dist::__private::check_weight_dims(#name, #shape, &[#(#dims),*])?;
                })
            })
            .collect()
    };
    let (shape_checks, checkpoint_checks) = (dim_checks(false), dim_checks(true));
    let mut full_types = Vec::new();
    let (mut from_full, mut from_checkpoint) = (Vec::new(), Vec::new());
    let (mut gather_lets, mut gathered, mut layouts) = (Vec::new(), Vec::new(), Vec::new());
    for (((f, placement), name), segments) in
        fields.iter().zip(&placements).zip(&names).zip(&segments)
    {
        let ident = &f.ident;
        let dims = match &f.spec.dims {
            Some(dims) => {
                let dims = dims.iter().map(|d| d.0);
                quote!(::std::option::Option::Some(&[#(#dims),*][..]))
            }
            None => quote!(::std::option::Option::None),
        };
        if f.quantized {
            let q = quote!(::safemlx_dist::typed::QuantizedArray::<#placement, #comm>);
            full_types.push(quote!(::safemlx_dist::affine::AffineWeight));
            from_full.push(quote!(#q::from_full(&#ident, comm, stream)?));
            let dims = match &f.spec.dims {
                Some(dims) if dims.len() == 2 => {
                    let (rows, columns) = (dims[0].0, dims[1].0);
                    quote!(::std::option::Option::Some([#rows, #columns]))
                }
                _ => quote!(::std::option::Option::None),
            };
            from_checkpoint.push(quote!(weights.quantized::<#placement>(#name, #dims, stream)?));
            let parts: Vec<_> = ["weight", "scales", "biases", "quantization"]
                .iter()
                .map(|part| quote::format_ident!("{}_{}", ident, part))
                .collect();
            gather_lets.push(quote! {
                let [#(#parts),*] = ::safemlx_dist::__private::checkpoint_tensors(self.#ident.gather_full(stream)?);
            });
            let stored = [
                name.clone(),
                format!("{name}.scales"),
                format!("{name}.biases"),
                format!("{name}.quantization"),
            ];
            gathered.extend(stored.iter().zip(&parts).map(|(n, p)| quote!((#n, #p))));
            layouts.push(
                quote!(::safemlx_dist::typed::FieldLayout::of_quantized(#name, &self.#ident)),
            );
        } else {
            full_types.push(quote!(::safemlx::Array));
            from_full.push(
                quote!(::safemlx_dist::__private::shard_weight::<#placement, #comm>(
                #ident, comm, #segments, #name, stream,
            )?),
            );
            from_checkpoint.push(quote!(weights.get_fused::<#placement>(
                #name, #dims, #segments, stream,
            )?));
            gathered.push(quote!((#name, ::safemlx_dist::__private::gather_weight(&self.#ident, #segments, stream)?)));
            layouts.push(
                quote!(::safemlx_dist::typed::FieldLayout::of(#name, #segments, &self.#ident)),
            );
        }
    }
    let docs_from = format!(
        "Builds `{name}` on this rank from full (unsharded) weights: each rank keeps exactly its part of each (fields: {}). No communication.",
        names.join(", ")
    );
    let docs_checkpoint = format!(
        "Builds `{name}` on this rank from `weights`, each field read under its own name ({}), as `gather_full` gives them: each rank reads only its part of each. No communication.",
        names.join(", ")
    );
    // Trainable: every field a `ShardedArray` (quantized weights are not).
    let parameters = if fields.iter().any(|f| f.quantized) {
        quote!()
    } else {
        let count = idents.len();
        let index = 0..count;
        quote! {
            impl #impl_generics ::safemlx_dist::grad::Parameters for #name #ty_generics #where_clause {
                fn parameters(&self) -> ::std::vec::Vec<::safemlx_dist::grad::Parameter> {
                    ::std::vec![#(::safemlx_dist::grad::Parameter::of(&self.#idents),)*]
                }

                fn with_parameters(
                    &self,
                    locals: &[::safemlx::Array],
                ) -> ::safemlx_dist::Result<Self> {
                    ::safemlx_dist::grad::check_count(#count, locals.len())?;
                    Ok(Self {
                        #(#idents: ::safemlx_dist::ShardedArray::from_local(
                            locals[#index].clone(),
                            self.#idents.comm(),
                            self.#idents.global_shape(),
                        )?,)*
                    })
                }
            }
        }
    };
    quote! {
        #item

        #parameters

        impl #impl_generics #name #ty_generics #where_clause {
            #[doc = #docs_from]
            ///
            /// # Errors
            /// A weight whose sharded axis is missing, or whose segments do
            /// not divide evenly over the ranks, with the field's name.
            #[allow(clippy::too_many_arguments)]
            pub fn from_full(
                comm: &#comm,
                #(#idents: #full_types,)*
                stream: &::safemlx::Stream,
            ) -> ::safemlx_dist::Result<Self> {
                #(#shape_checks)*
                Ok(Self {
                    #(#idents: #from_full,)*
                })
            }

            #[doc = #docs_checkpoint]
            ///
            /// # Errors
            /// A missing tensor, one of another shape than declared, one
            /// without the field's sharded axis, or segments that do not
            /// divide evenly, naming the tensor.
            pub fn load_fields(
                weights: &::safemlx_dist::checkpoint::Weights<'_, #comm>,
                stream: &::safemlx::Stream,
            ) -> ::safemlx_dist::Result<Self> {
                #(#checkpoint_checks)*
                Ok(Self {
                    #(#idents: #from_checkpoint,)*
                })
            }

            /// Gathers every weight back to its full (unsharded) form, e.g.
            /// to save a checkpoint: `(field name, full array)` in field
            /// order. Cost: one `all_gather` per sharded field.
            pub fn gather_full(
                &self,
                stream: &::safemlx::Stream,
            ) -> ::safemlx_dist::Result<::std::vec::Vec<(&'static str, ::safemlx::Array)>> {
                #(#gather_lets)*
                Ok(::std::vec![
                    #(#gathered,)*
                ])
            }

            /// Each field's name, placement, segments, global and local shape.
            pub fn layout(&self) -> ::std::vec::Vec<::safemlx_dist::typed::FieldLayout> {
                ::std::vec![
                    #(#layouts,)*
                ]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::TokenTree;

    /// The Rust block after `marker` in the book's "#[sharded]" chapter;
    /// rustdoc's hidden `# ` lines kept (unhidden) or dropped.
    fn block(marker: &str, hidden: bool) -> String {
        let chapter = include_str!("../../book/src/sharded.md");
        let start = chapter.find(marker).expect("marker in the chapter");
        let code = &chapter[start..];
        let code = &code[code.find("```rust").expect("code block") + 7..];
        let code = &code[code.find('\n').unwrap_or(0)..];
        let end = code.find("```").expect("end of block");
        code[..end]
            .lines()
            .filter(|l| hidden || !l.starts_with("# "))
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .filter(|l| !l.trim_start().starts_with("// "))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Expands the example after `example` as the compiler would and
    /// compares it, token by token, with the block after `expansion`.
    fn check(example: &str, expansion: &str) {
        let tokens: TokenStream = block(example, true).parse().expect("example parses");
        let mut tokens = tokens.into_iter().skip_while(|t| t.to_string() != "#");
        tokens.next(); // `#`
        let Some(TokenTree::Group(attribute)) = tokens.next() else {
            panic!("the example starts with #[sharded...]");
        };
        // `sharded` or `sharded(ARGS)`: the macro gets ARGS.
        let args = attribute
            .stream()
            .into_iter()
            .find_map(|t| match t {
                TokenTree::Group(g) => Some(g.stream()),
                _ => None,
            })
            .unwrap_or_default();
        let expanded = sharded(args, tokens.collect()).to_string();
        let shown: TokenStream = block(expansion, false).parse().expect("expansion parses");
        // Compare without whitespace and trailing commas (rustfmt's choice).
        let normal = |code: &str| {
            let mut text: String = code.split_whitespace().collect();
            for (from, to) in [(",)", ")"), (",]", "]"), (",}", "}")] {
                text = text.replace(from, to);
            }
            text
        };
        assert_eq!(
            normal(&expanded),
            normal(&shown.to_string()),
            "book/src/sharded.md's expansion after {expansion} is out of date; the macro now gives:\n{expanded}"
        );
    }

    /// The book shows what each form expands to; these keep that text true.
    #[test]
    fn the_book_shows_the_real_struct_expansion() {
        check("<!-- example -->", "<!-- expansion -->");
    }

    #[test]
    fn the_book_shows_the_real_function_expansion() {
        check("<!-- fn example -->", "<!-- fn expansion -->");
    }

    #[test]
    fn the_book_shows_the_real_routing_expansion() {
        check("<!-- route example -->", "<!-- route expansion -->");
    }
}
