use safemlx_dist::grad::Parameters;
use safemlx_dist::nn::Mlp;

#[derive(Parameters)]
struct Block {
    #[parameters(frozen)]
    mlp: Mlp,
}

fn main() {}
