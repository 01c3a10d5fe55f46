"""LoRA adaptation (Hu et al., 2022) through peft: r = 8, alpha = 16 as in Marek et al. 2026, appendix B.2."""

from __future__ import annotations

from bench.defense import Adapted, Defense, TrainContext
from bench.params import Param
from bench.registry import register_defense
from bench.training import train_causal_lm
from defenses.finetune import ADAPT_PARAMS


@register_defense("lora")
class LoRA(Defense):
    description = "Low-rank adapters on the attention and MLP projections (peft); only A and B train, merged at release."
    params = tuple(p for p in ADAPT_PARAMS if p.name != "lr") + (
        Param("lr", float, 3e-3, "AdamW learning rate", low=0.0, low_inclusive=False),
        Param("r", int, 8, "adapter rank", low=1),
        Param("alpha", int, 16, "LoRA scaling numerator (scale = alpha / r)", low=1),
        Param("dropout", float, 0.0, "dropout on the adapter input", low=0.0, high=1.0, high_inclusive=False),
        Param("target_modules", list, ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
              "module names that get adapters", item_type=str),
    )

    def adapt(self, model, data, ctx: TrainContext):
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                         target_modules=list(self.target_modules), task_type="CAUSAL_LM", bias="none")
        peft_model = get_peft_model(model, cfg)
        trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        stats = train_causal_lm(peft_model, ctx.encode(data.texts, self.chunk_length), epochs=self.epochs,
                                lr=self.lr, batch_size=self.batch_size, seed=ctx.seed, pad_id=ctx.pad_id,
                                weight_decay=self.weight_decay, autocast_bf16=ctx.autocast_bf16, device=ctx.device,
                                desc="adapt: lora", progress=ctx.progress)
        return Adapted(peft_model.merge_and_unload(), {"train": stats.to_dict(), "trainable_params": trainable})
