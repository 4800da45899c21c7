"""The presets: every method as data, :class:`Preset` (its :class:`~dppo_oat.trust_region.config.TrustRegion`
fields, its source, its name and what its mask blocks), in :data:`PRESETS`.

The paper's methods come first with its stability-analysis defaults (sec:stability, app:sanity_test_details), then
the training–inference mismatch fixes of other frameworks, then later trust regions; each ``source`` names the
equation or the file and defaults it follows. The docs' preset tables, the command line's ``--trust-region`` choices,
the analysis' legend names and the verl engine's losses are read from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """A named method: its :class:`~dppo_oat.trust_region.config.TrustRegion` fields and where it is defined."""

    fields: dict
    """The fields it sets; the others keep the TrustRegion's defaults."""
    source: str
    """Where the method is defined: the paper's equation or figure, or the file, function and defaults followed."""
    label: str = ""
    """The method's name as its source writes it (legends, the README's table)."""
    blocks: str = ""
    """What its mask M_t blocks (and w_t, where it differs), in a few words (the README's table)."""


_GRPO_CLIP = {"rule": "ratio", "eps_low": 0.2, "eps_high": 0.28}
_PPO_ON_RECOMPUTE = {"rule": "ratio", "eps_low": 0.2, "eps_high": 0.2, "anchor": "recompute"}
"""PPO's clip (ε = 0.2) on π_θ/π_θ', the loss under SkyRL's, OpenRLHF's, AReaL's and verl's mismatch corrections."""
PRESETS: dict[str, Preset] = {
    "ppo": Preset(
        {"rule": "ratio", "eps_low": 0.2, "eps_high": 0.2}, "PPO-ratio, eq:ppo-clip, ε = 0.2",
        label="PPO", blocks="A>0 & r>1+ε_high, A<0 & r<1−ε_low",
    ),
    "grpo_clip_higher": Preset(
        dict(_GRPO_CLIP), "GRPO with Clip-Higher, app:sanity_test_details (ε_low 0.2, ε_high 0.28; 0.27 in scaling)",
        label="GRPO-ClipHigher", blocks="as PPO, with ε_high > ε_low",
    ),
    "cispo": Preset(
        {"rule": "none", "is_cap": 3.0}, "PG-TIS (CISPO), app:sanity_test_details, C = 3 (5 in scaling)",
        label="CISPO (PG-TIS)", blocks="nothing; w = min(r, C)",
    ),
    "pg_is": Preset(
        {"rule": "none"}, "PG-IS, app:sanity_test_details, M = 1, C = ∞",
        label="PG-IS", blocks="nothing; w = r, untruncated",
    ),
    "minirl": Preset(
        {**_GRPO_CLIP, "anchor": "recompute"}, "MiniRL, app:sanity_test_details: clip on π_θ/π_θ'",
        label="MiniRL", blocks="GRPO's clip on π_θ/π_θ'",
    ),
    "minirl_tis": Preset(
        {**_GRPO_CLIP, "anchor": "recompute", "is_cap": 3.0}, "MiniRL-TIS, app:sanity_test_details, C = 3",
        label="MiniRL-TIS", blocks="GRPO's clip on π_θ/π_θ'; w = min(r, C)",
    ),
    "dppo_binary_tv": Preset(
        {"rule": "binary_tv", "delta": 0.15}, "DPPO-Binary-TV, eq:binary_tv, δ = 0.15",
        label="DPPO-Binary-TV", blocks="A>0 & r>1 & D>δ, A<0 & r<1 & D>δ; D = |π − μ|",
    ),
    "dppo_binary_kl": Preset(
        {"rule": "binary_kl", "delta": 0.05}, "DPPO-Binary-KL, eq:binary_kl, δ = 0.05",
        label="DPPO-Binary-KL", blocks="as DPPO-Binary-TV, D the binary KL",
    ),
    "dppo_binary_kl_neg": Preset(
        {"rule": "binary_kl", "delta": 0.05, "mask_side": "negative"},
        "DPPO-Binary-KL's A<0 half alone (the CPU study's ablation): block only A<0 & r<1 & D>δ",
        label="DPPO-KL (A<0 half)", blocks="A<0 & r<1 & D>δ only (the CPU study's ablation)",
    ),
    "dppo_binary_kl_pos": Preset(
        {"rule": "binary_kl", "delta": 0.05, "mask_side": "positive"},
        "DPPO-Binary-KL's A>0 half alone (the CPU study's ablation): block only A>0 & r>1 & D>δ",
        label="DPPO-KL (A>0 half)", blocks="A>0 & r>1 & D>δ only (the CPU study's ablation)",
    ),
    "dppo_topk_tv": Preset(
        {"rule": "topk_tv", "delta": 0.15, "k": 20}, "DPPO-TopK-TV, eq:topk_tv, K = 20",
        label="DPPO-TopK-TV", blocks="as DPPO, D the TV on TopK(μ, K) ∪ {a_t} + other",
    ),
    "dppo_topk_kl": Preset(
        {"rule": "topk_kl", "delta": 0.05, "k": 20}, "DPPO-TopK-KL, eq:topk_kl, K = 20",
        label="DPPO-TopK-KL", blocks="as DPPO, D the KL on TopK(μ, K) ∪ {a_t} + other",
    ),
    "dppo_binary_tv_recompute": Preset(
        {"rule": "binary_tv", "delta": 0.15, "anchor": "recompute"}, "decoupled DPPO-TV, fig:which_trust_region",
        label="DPPO-TV (recompute)", blocks="DPPO-Binary-TV's mask anchored on π_θ'",
    ),
    "dppo_binary_kl_recompute": Preset(
        {"rule": "binary_kl", "delta": 0.05, "anchor": "recompute"}, "decoupled DPPO-KL, fig:which_trust_region",
        label="DPPO-KL (recompute)", blocks="DPPO-Binary-KL's mask anchored on π_θ'",
    ),
    "mask_negative": Preset(
        {"rule": "mask_negative", "delta": 0.5}, "Takeaway 3, fig:ablation_mask_negative: A<0 and μ−π ≥ 0.5",
        label="Mask-negative", blocks="A<0 & μ−π ≥ δ (Takeaway 3's minimal mask)",
    ),
    "relax_low": Preset(
        {**_GRPO_CLIP, "relax": "low", "alpha": 0.1}, "Relax-low, fig:clip_direction, α = 0.1",
        label="Relax-low", blocks="GRPO's clip, ε_low = ∞ for μ < α",
    ),
    "relax_high": Preset(
        {**_GRPO_CLIP, "relax": "high", "alpha": 0.1}, "Relax-high, fig:clip_direction, α = 0.1",
        label="Relax-high", blocks="GRPO's clip, ε_high = ∞ for μ < α",
    ),
    "relax_both": Preset(
        {**_GRPO_CLIP, "relax": "both", "alpha": 0.1}, "Relax-both, fig:clip_direction, α = 0.1",
        label="Relax-both", blocks="GRPO's clip, ε = ∞ on both sides for μ < α",
    ),
    # --- training–inference mismatch fixes of other frameworks, as their sources define them
    "tis": Preset(
        {**_PPO_ON_RECOMPUTE, "is_weight": "decoupled_token", "is_cap": 2.0},
        "token TIS: SkyRL skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py compute_tis_ratio "
        "(tis_ratio_type token, token_tis_ratio_clip_high 2.0) on ppo_utils.py ppo_policy_loss (ε 0.2); slime "
        "--use-tis --tis-clip 2.0; verl decoupled_token_is(threshold=2.0)",
        label="Token-TIS", blocks="PPO's clip on π_θ/π_θ'; w = (π_θ/π_θ')·min(π_θ'/μ, C)",
    ),
    "seq_tis": Preset(
        {**_PPO_ON_RECOMPUTE, "is_weight": "decoupled_seq", "is_cap": 5.0},
        "sequence TIS: SkyRL skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py compute_tis_ratio "
        "(tis_ratio_type sequence, sequence_tis_ratio_clip_high 5.0) on ppo_utils.py ppo_policy_loss (ε 0.2)",
        label="Seq-TIS", blocks="PPO's clip on π_θ/π_θ'; w = (π_θ/π_θ')·min(∏_t π_θ'/μ, C)",
    ),
    "icepop": Preset(
        {**_PPO_ON_RECOMPUTE, "is_weight": "decoupled_token", "mismatch_mask": "token", "mismatch_low": 0.5,
         "mismatch_high": 5.0},
        "IcePop: OpenRLHF openrlhf/models/loss.py PolicyLoss (vllm_is_correction_type icepop, "
        "is_correction_threshold [0.5, 5.0], ε 0.2): PPO on π_θ' × ρ·1[0.5 ≤ ρ ≤ 5]; NeMo-RL the same band",
        label="IcePop", blocks="PPO's clip on π_θ/π_θ'; tokens whose π_θ'/μ leaves [ρ_low, ρ_high]",
    ),
    "seq_geo_mask": Preset(
        {**_PPO_ON_RECOMPUTE, "is_weight": "proximal", "mismatch_mask": "seq_geo", "mismatch_low": 0.99,
         "mismatch_high": 1.01},
        "geometric sequence mask: SkyRL skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py "
        "compute_sequence_mask (sequence_mask_metric geometric, geo_mask_low 0.99, geo_mask_high 1.01) on "
        "ppo_utils.py ppo_policy_loss (ε 0.2), no TIS",
        label="Seq-Geo-Mask",
        blocks="PPO's clip on π_θ/π_θ'; responses whose geometric mean of π_θ'/μ leaves [ρ_low, ρ_high]",
    ),
    "decoupled_ppo": Preset(
        {**_PPO_ON_RECOMPUTE, "is_weight": "decoupled_token", "mismatch_mask": "token", "mismatch_high": 5.0},
        "AReaL decoupled PPO: areal/utils/functional/functional.py ppo_actor_loss_fn (use_decoupled_loss, eps_clip "
        "0.2): PPO on π_prox = π_θ' × π_prox/μ, with rejection_sampling level token, action mask, metric ratio, "
        "upper 5.0 (areal/api/cli_args.py RejectionSamplingConfig)",
        label="Decoupled PPO", blocks="PPO's clip on π_θ/π_θ'; tokens whose π_θ'/μ exceeds ρ_high",
    ),
    "dppo_binary_tv_kl": Preset(
        {"rule": "binary_tv", "delta": 0.2, "kl_tau": 1e-3},
        "DPPO + KL, prime-rl's default loss: src/prime_rl/trainer/rl/loss.py default_loss_fn (DefaultLossConfig "
        "dppo_mask_low/high 0.2, kl_tau 1e-3): binary TV on π − μ + τ·log²(π/μ) on every loss token",
        label="DPPO-Binary-TV + KL", blocks="as DPPO-Binary-TV, plus τ·log²(π/μ) on every token",
    ),
    # --- later trust regions: DRPO, CPPO, M2PO (equation numbers as each source cites them)
    "drpo": Preset(
        {"rule": "drpo", "delta": 12.5},
        "DRPO (arXiv 2606.09821): objective eq. 8, Σ_t r_t·A_t − |A_t|·μ(y_t|s_t)·(r_t − 1)²/(2δ), no IS "
        "truncation; gradient eq. 9, weight (Table 1) 1 − sign(A_t(r_t − 1))·|π − μ|/δ; δ = 12.5 (§4). Reference "
        "code Tencent-Hunyuan/UniRL unirl/algorithms/drpo.py _drpo_loss (drpo_epsilon 12.5); equation numbers and δ "
        "as that code and its README cite the paper",
        label="DRPO", blocks="nothing; a quadratic penalty |A|·μ·(r − 1)²/(2δ)",
    ),
    "cppo": Preset(
        {"rule": "cppo_topk_tv", "delta": 0.15, "k": 20, "w_min": 0.8, "delta_b": 0.02},
        "CPPO (arXiv 2606.10968): DPPO's surrogate under the mask of eq. 8-10 and Algorithm 1: keep t iff "
        "A_t(r_t − 1) ≤ 0 or w_t·D_t ≤ min(δ, δ + δ_b·W_{t−1} − S_{t−1}), w_t = 1 − (1 − w_min)(t − 1)/(T − 1) "
        "(eq. 9), δ_b = clamp(P90(D_{1:T}), δ_b,min, 2δ_b,min) per response (eq. 22); top-K TV, K = 20 (the "
        "paper's main runs), δ = 0.15 (dense models), w_min 0.8, δ_b,min 0.02. Reference code Tencent-Hunyuan/UniRL "
        "unirl/algorithms/cppo.py _cppo_mask and verl PR 6731 docs/algo/cppo.md (binary TV); equation numbers as "
        "those cite the paper",
        label="CPPO", blocks="as DPPO-TopK-TV, position-weighted D against a prefix budget",
    ),
    "cppo_binary_tv": Preset(
        {"rule": "cppo_binary_tv", "delta": 0.15, "w_min": 0.8, "delta_b": 0.02},
        "CPPO-Binary-TV: cppo with D_t = |π − μ|, as the reference code computes it (Tencent-Hunyuan/UniRL "
        "unirl/algorithms/cppo.py, verl PR 6731 docs/algo/cppo.md)",
        label="CPPO-Binary-TV", blocks="as DPPO-Binary-TV, position-weighted D against a prefix budget",
    ),
    "m2po": Preset(
        {"rule": "m2po", "tau_m2": 0.04},
        "M2PO (arXiv 2510.01161v2, sec. 5.2): M̂2 = mean (log r)² (eq. 4); Algorithm 1 masks the trust-region tokens "
        "(A > 0 & r > 1 or A < 0 & r < 1) of largest (log r)² until their mean is ≤ τ_M2 = 0.04; objective eq. 5, "
        "M·r·A averaged over all tokens (footnote 2), no IS truncation. Batch = one loss call (a micro-batch), as "
        "Infini-AI-Lab/M2PO verl/workers/actor/dp_actor.py calls compute_m2po_policy_loss (M2_budget 0.04)",
        label="M2PO", blocks="trust-region tokens of largest (log r)² until their mean ≤ τ_M2",
    ),
    # --- the field after DPPO: sequence masks, the symmetric band, soft gates and sequence ratios (a row is one turn)
    "ipo": Preset(
        {"rule": "ipo", "delta": 0.1, "kl_tau": 1e-3},
        "IPO, the symmetric DPPO band: prime-rl src/prime_rl/trainer/rl/loss.py ipo_loss_fn (IPOLossConfig "
        "ipo_threshold 0.1, kl_tau 1e-3, packages/prime-rl-configs/src/prime_rl/configs/trainer.py; commit 559b447): "
        "tokens with |π − μ| > δ masked whatever the sign of A, w = π/μ untruncated, + τ·log²(π/μ) on every loss "
        "token (the PR threads #1930, #2434 were not read here)",
        label="IPO", blocks="|π − μ| > δ whatever the sign of A; plus τ·log²(π/μ)",
    ),
    "trm_max": Preset(
        {"rule": "trm_max", "eps_low": 0.2, "eps_high": 0.2, "delta": 2.5},
        "TRM-Max, Trust Region Masking (arXiv 2512.23075; only its abstract could be read here): PPO's clip (ε 0.2) "
        "on π_θ/μ, and a whole response masked when max_t ½(log π_θ/μ)² > δ, as verl's bypass mode (loss_type "
        "ppo_clip) with rollout_rs seq_max_k2 (verl/trainer/ppo/rollout_corr_helper.py "
        "compute_rollout_rejection_mask, PR #4544); δ = 2.5 from verl's "
        "examples/rollout_correction/run_qwen2_5_7b_fsdp_multi_rs.sh: verl has no TRM-Max preset and the paper's "
        "bound was not read; slime PR #1568's code was not read",
        label="TRM-Max", blocks="PPO's clip; whole responses whose max ½(log r)² exceeds δ",
    ),
    "trm_avg": Preset(
        {"rule": "trm_avg", "eps_low": 0.2, "eps_high": 0.2, "delta": 0.01},
        "TRM-Avg, Trust Region Masking (arXiv 2512.23075; abstract only): PPO's clip (ε 0.2) on π_θ/μ, and a whole "
        "response masked when mean_t (r_t − 1 − log r_t) > δ (k3): verl/trainer/config/algorithm.py "
        "RolloutCorrectionConfig.bypass_ppo_clip_k3_rs (rollout_rs seq_mean_k3, rs_threshold 0.01; PR #4544); slime "
        "PR #1568's code was not read",
        label="TRM-Avg", blocks="PPO's clip; whole responses whose mean r − 1 − log r exceeds δ",
    ),
    "opsm": Preset(
        {"rule": "opsm", "eps_low": 0.2, "eps_high": 0.2, "delta": 0.5},
        "DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556 eq. 9, as TRL cites it; the paper was not read "
        "here): TRL trl/trainer/grpo_trainer.py GRPOTrainer.get_off_policy_mask keeps t iff A_t ≥ 0 or the "
        "response's mean log(μ/π_θ) ≤ δ, on GRPO's clip (epsilon 0.2), here anchored on μ; δ = 0.5, the starting "
        "point of TRL docs/source/paper_index.md (the paper gives none; off_policy_mask_threshold defaults to None); "
        "TRL's separate vLLM IS correction is not part of the preset; ms-swift was not read",
        label="OPSM (DeepSeek-V3.2)", blocks="PPO's clip; tokens with A<0 of responses whose mean log(μ/π) exceeds δ",
    ),
    "vaco": Preset(
        {"rule": "vaco", "anchor": "recompute", "is_weight": "decoupled_token", "is_cap": 2.0, "eps_low": 0.2,
         "eps_high": 0.272, "delta": 0.3},
        "VACO (arXiv 2603.01365; the paper could not be read here) as open-instruct PR #1755 (head 5c2bf9a) "
        "implements it, open_instruct/grpo_utils.py compute_rho_correction (rho_divergence_algo vaco, "
        "rho_divergence_type tv): t dropped when the response's mean |π_θ' − μ| > δ and sign(log π_θ'/μ)·A_t > 0, on "
        "DAPO's clip of π_θ/π_θ' (clip_lower 0.2, clip_higher 0.272) with w = (π_θ/π_θ')·min(π_θ'/μ, 2) "
        "(rho_clamp_upper_bound 2.0); δ = 0.3 is the PR's own test value (test_vaco_tv_divergence): its default "
        "rho_mask_upper_bound 0 disables the mask",
        label="VACO",
        blocks="DAPO's clip on π_θ/π_θ'; tokens moving away from μ in responses whose mean |π_θ' − μ| exceeds δ",
    ),
    "gspo": Preset(
        {"rule": "gspo", "eps_low": 3e-4, "eps_high": 4e-4},
        "GSPO (arXiv 2507.18071) as verl runs it: verl/trainer/ppo/core_algos.py compute_policy_loss_gspo (loss_mode "
        "gspo): s_i = exp(mean_t log π_θ/μ) per response, PPO's clip on s_i, gradient s_i·A_t·∇log π_θ(a_t), log s_i "
        "clamped at 10; ε_low 3e-4, ε_high 4e-4 (examples/gspo_trainer/README.md, which runs it seq-mean-token-mean)",
        label="GSPO", blocks="PPO's clip on the response's ratio s = exp(mean_t log r); w = s",
    ),
    "sapo": Preset(
        {"rule": "sapo", "tau_pos": 1.0, "tau_neg": 1.05},
        "SAPO (arXiv 2511.20347) as verl runs it: verl/trainer/ppo/core_algos.py compute_policy_loss_sapo (loss_mode "
        "sapo): loss −f(r)·A with the gate f(r) = σ(τ(r − 1))·4/τ, r = π_θ/μ (log r clamped at ±20), τ = τ_pos where "
        "A > 0 and τ_neg elsewhere; gradient r·4σ(1 − σ)·A·∇log π_θ, no mask; τ_pos 1.0, τ_neg 1.05 "
        "(verl/workers/config/actor.py ActorConfig; TRL sapo_temperature_pos/neg the same); verl aggregates it "
        "seq-mean-token-mean",
        label="SAPO", blocks="nothing; w = r·f′(r), a soft gate",
    ),
    "minpro": Preset(
        {"rule": "minpro"},
        "MinPRO (arXiv 2601.22718; only its abstract could be read here): w_t = min_{j ≤ t} π_θ(a_j)/μ(a_j) over the "
        "response's tokens so far, the non-cumulative surrogate of the prefix ratio ∏_{j ≤ t} π_θ/μ that the "
        "abstract names ('the minimum token-level ratio observed in the preceding prefix'), M = 1, no cap; whether "
        "t itself belongs to the prefix and any clip of the paper's objective are not verified",
        label="MinPRO", blocks="nothing; w_t = min_{j≤t} r_j",
    ),
}
"""The paper's methods with its stability-analysis defaults (sec:stability, app:sanity_test_details), then the
training–inference mismatch fixes of other frameworks, then later trust regions (see each ``source``)."""
