//! `#[derive(Parameters)]`: a composite model's trainable arrays are its
//! fields' (or its variant's), in declaration order.
//!
//! A struct with named fields lists each field's parameters in turn and
//! rebuilds each field from its run of arrays; a field marked
//! `#[parameters(skip)]` (a configuration, a path, a split) is cloned. An
//! enum whose variants each hold one value is that value's parameters.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields};

/// Expands the derive on `input`, or a compile error naming what it does
/// not support.
pub fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(e) => return e.to_compile_error(),
    };
    match expand(&input) {
        Ok(tokens) => tokens,
        Err(e) => e.to_compile_error(),
    }
}

fn expand(input: &DeriveInput) -> syn::Result<TokenStream> {
    let name = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let (parameters, with_parameters) = match &input.data {
        Data::Struct(data) => struct_bodies(&data.fields, name)?,
        Data::Enum(data) => enum_bodies(data, name)?,
        Data::Union(_) => {
            return Err(syn::Error::new_spanned(
                name,
                "#[derive(Parameters)] applies to structs with named fields and to enums of one-value variants, not to unions",
            ))
        }
    };
    Ok(quote! {
        impl #impl_generics ::safemlx_dist::grad::Parameters for #name #ty_generics #where_clause {
            fn parameters(&self) -> ::std::vec::Vec<::safemlx_dist::grad::Parameter> {
                #parameters
            }

            fn with_parameters(
                &self,
                locals: &[::safemlx::Array],
            ) -> ::safemlx_dist::Result<Self> {
                #with_parameters
            }
        }
    })
}

/// Whether `field` carries `#[parameters(skip)]`.
fn skipped(field: &syn::Field) -> syn::Result<bool> {
    let mut skip = false;
    for attr in field
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("parameters"))
    {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                skip = true;
                Ok(())
            } else {
                Err(meta.error("the only `parameters` option is `skip`"))
            }
        })?;
    }
    Ok(skip)
}

fn struct_bodies(fields: &Fields, name: &syn::Ident) -> syn::Result<(TokenStream, TokenStream)> {
    let Fields::Named(fields) = fields else {
        return Err(syn::Error::new_spanned(
            name,
            "#[derive(Parameters)] needs named fields (`struct S { a: A, ... }`)",
        ));
    };
    let (mut trained, mut kept) = (Vec::new(), Vec::new());
    for field in &fields.named {
        let ident = field.ident.clone().expect("named fields have names");
        if skipped(field)? {
            kept.push(ident);
        } else {
            trained.push(ident);
        }
    }
    let trait_path = quote!(::safemlx_dist::grad::Parameters);
    let index = 0..trained.len();
    let parameters = quote! {
        let mut all = ::std::vec::Vec::new();
        #(all.extend(#trait_path::parameters(&self.#trained));)*
        all
    };
    let with_parameters = quote! {
        let counts = [#(#trait_path::parameters(&self.#trained).len()),*];
        let parts = ::safemlx_dist::grad::split_locals(locals, &counts)?;
        Ok(Self {
            #(#trained: #trait_path::with_parameters(&self.#trained, parts[#index])?,)*
            #(#kept: ::std::clone::Clone::clone(&self.#kept),)*
        })
    };
    Ok((parameters, with_parameters))
}

fn enum_bodies(data: &syn::DataEnum, name: &syn::Ident) -> syn::Result<(TokenStream, TokenStream)> {
    let mut variants = Vec::new();
    for variant in &data.variants {
        match &variant.fields {
            Fields::Unnamed(f) if f.unnamed.len() == 1 => variants.push(&variant.ident),
            _ => {
                return Err(syn::Error::new_spanned(
                    &variant.ident,
                    format!(
                        "#[derive(Parameters)] on enum `{name}`: variant `{}` must hold one value (`{}(Model)`)",
                        variant.ident, variant.ident
                    ),
                ))
            }
        }
    }
    let trait_path = quote!(::safemlx_dist::grad::Parameters);
    let parameters = quote! {
        match self {
            #(Self::#variants(m) => #trait_path::parameters(m),)*
        }
    };
    let with_parameters = quote! {
        match self {
            #(Self::#variants(m) => Ok(Self::#variants(#trait_path::with_parameters(m, locals)?)),)*
        }
    };
    Ok((parameters, with_parameters))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_text(source: &str) -> String {
        derive(source.parse().expect("tokens")).to_string()
    }

    #[test]
    fn skipped_fields_are_cloned_and_the_rest_rebuilt_in_order() {
        let text = expand_text("struct M { a: A, #[parameters(skip)] c: C, b: B }");
        let a = text.find("parameters (& self . a)").expect("a listed");
        let b = text.find("parameters (& self . b)").expect("b listed");
        assert!(a < b, "{text}");
        assert!(text.contains("c : :: std :: clone :: Clone :: clone (& self . c)"));
        assert!(!text.contains("parameters (& self . c)"), "{text}");
    }

    #[test]
    fn unsupported_shapes_are_named() {
        let text = expand_text("struct T(A, B);");
        assert!(text.contains("needs named fields"), "{text}");
        let text = expand_text("enum E { A(X), B { y: Y } }");
        assert!(text.contains("variant `B` must hold one value"), "{text}");
        let text = expand_text("struct M { #[parameters(frozen)] a: A }");
        assert!(
            text.contains("the only `parameters` option is `skip`"),
            "{text}"
        );
    }
}
