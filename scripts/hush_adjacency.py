"""What Hush's accounting covers: the carriers of a secret removed, against their content changed.

Ganesh et al. (2025) calibrate σ with the pair N(Σ_i Bern(ρ_i), σ²)^T vs N(0, σ²)^T, which models the records
carrying secret j taken out of the data. Their Definition 3.1 makes two inputs neighbours when those records stay
and only their content changes; then a carrier's clipped gradient can turn from +C to −C, and the outputs include
Σ_s π_s N(s, σ²)^T vs Σ_s π_s N(−s, σ²)^T under the same Poisson draw (:func:`bench.secret_accounting.replacement_kl`).
This prints, for one secret, the σ Hush calibrates (both KL directions, as privbench's default), the ledger's KL,
the KL of that replacement pair, and the posterior bound Lemma 3.2 gives from each; then the ratio of the two KLs
across σ. privbench calibrates as the paper does; docs/hush.md, "Deviations", says what this means for the
guarantee and for the audit.

    python scripts/hush_adjacency.py [--rates 0.05,0.1,0.02,0.08,0.03,0.06] [--steps 100] [--p 0.01] [--r 0.2]
"""

from __future__ import annotations

import argparse
import sys

from bench.secret_accounting import (kl_target, mixture_kl, poisson_binomial, posterior_bound, replacement_kl,
                                     secret_kl, sigma_for_kl)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="0.05,0.1,0.02,0.08,0.03,0.06",
                        help="Poisson rates ρ_i of the secret's carriers, comma-separated")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--p", type=float, default=0.01, help="prior success p_j")
    parser.add_argument("--r", type=float, default=0.2, help="target posterior success r_j")
    args = parser.parse_args(argv)
    try:
        rates = [float(x) for x in args.rates.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--rates must be comma-separated numbers, got {args.rates!r}")
    if not rates or not all(0 < q <= 1 for q in rates):
        parser.error("--rates needs at least one rate in (0, 1]")
    if args.steps < 1 or not 0 < args.p < args.r < 1:
        parser.error("need --steps >= 1 and 0 < --p < --r < 1")
    mu = kl_target(args.p, args.r)
    sigma = sigma_for_kl(rates, args.steps, mu, direction="both")
    removed = secret_kl(rates, sigma, args.steps, "both")
    replaced = args.steps * replacement_kl(poisson_binomial(rates), sigma)
    print(f"secret with {len(rates)} carriers, T = {args.steps}, (p, r) = ({args.p}, {args.r}): "
          f"μ = {mu:.5g}, σ = {sigma:.5g}")
    print(f"{'pair':<34} {'KL':>9} {'posterior bound (Lemma 3.2)':>29}")
    print(f"{'carriers removed (the ledger)':<34} {removed:>9.5g} {posterior_bound(removed, args.p):>29.4f}")
    print(f"{'content changed, +C to -C':<34} {replaced:>9.5g} {posterior_bound(replaced, args.p):>29.4f}")
    pmf = poisson_binomial(rates)
    print("\nKL(content changed) / KL(carriers removed), per step, by σ:")
    for s in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0):
        print(f"  σ = {s:>4}: {replacement_kl(pmf, s) / mixture_kl(pmf, s, 'both'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
