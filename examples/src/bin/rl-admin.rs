//! `rl-admin`: list, inspect and reset rate limits in a running deployment's
//! Redis; see `rl_examples::admin`.

fn main() -> std::process::ExitCode {
    rl_examples::admin::main()
}
