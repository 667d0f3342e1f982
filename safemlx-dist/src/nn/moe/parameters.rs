//! The MoE layer's trainable parameters.

use safemlx::Array;

use super::{Experts, Moe, SharedExperts};
use crate::error::{Error, Result};
use crate::typed::{Replicated, ShardedArray};

/// The router (replicated), this rank's experts or slices (`gate`, `up`,
/// `down`), then the shared experts' MLP and gate when the layer has them.
/// Their gradients come from [`Moe::forward`]; the load-balancing and
/// z-losses are statistics (host numbers), not part of the traced loss.
impl crate::grad::Parameters for Moe {
    fn parameters(&self) -> Vec<crate::grad::Parameter> {
        let mut all = vec![crate::grad::Parameter::of(&self.router)];
        all.extend(match self.experts.as_ref() {
            Experts::Parallel(w) => w.parameters(),
            Experts::TensorParallel(w) => w.parameters(),
        });
        if let Some(shared) = &self.shared {
            all.extend(shared.mlp.parameters());
            all.extend(shared.gate.iter().map(crate::grad::Parameter::of));
        }
        all
    }

    fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        let shared = self.shared.as_deref();
        let counts = [
            1,
            3,
            shared.map_or(0, |sh| sh.mlp.parameters().len()),
            shared.map_or(0, |sh| usize::from(sh.gate.is_some())),
        ];
        let parts = crate::grad::split_locals(locals, &counts)?;
        let router = &parts[0][0];
        if router.shape() != self.router.local().shape() {
            return Err(Error::Shape(format!(
                "the MoE router is {:?} but an array of shape {:?} was given",
                self.router.local().shape(),
                router.shape()
            )));
        }
        let experts = match self.experts.as_ref() {
            Experts::Parallel(w) => Experts::Parallel(w.with_parameters(parts[1])?),
            Experts::TensorParallel(w) => Experts::TensorParallel(w.with_parameters(parts[1])?),
        };
        let shared = match shared {
            None => None,
            Some(sh) => {
                let gate = match &sh.gate {
                    Some(g) => Some(ShardedArray::<Replicated>::from_local(
                        parts[3][0].clone(),
                        g.comm(),
                        g.global_shape(),
                    )?),
                    None => None,
                };
                Some(Box::new(SharedExperts {
                    mlp: sh.mlp.with_parameters(parts[2])?,
                    gate,
                }))
            }
        };
        Ok(Self {
            router: ShardedArray::from_local(
                router.clone(),
                self.router.comm(),
                self.router.global_shape(),
            )?,
            experts: Box::new(experts),
            shared,
            config: self.config,
            num_experts: self.num_experts,
        })
    }
}
