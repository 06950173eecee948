"""The five decoders on a pretrained chat LM: prompts, the delimiter, scoring by answer parsing,
and one test split's row of metrics (`experiment_pretrained` runs the experiment).

    lm = ChatLM(cfg, params, tokenizer)            # any tokenizer with encode, encode_chat, decode
    prompts = lm.prompts(problems)                 # left-padded chat prompts and their mask
    out = lm.decode(prompts, decoder=DECODERS["soft"], rng=key, max_new_tokens=192, samples=16)
    correct_SB = lm.correct(out, problems)         # the number after the delimiter is the answer
    row = lm.split_row(problems, key, setting)     # every decoder's metrics on one test split

The delimiter: SmolLM2-Instruct is not a reasoning model and has no `</think>`. The prompt asks
it to think step by step and end with "The answer is <number>."; the delimiter is the token
" answer" (one id), detected as decode.py detects `</think>`: on the post-noise top-1 token of a
soft step, on the sampled token of a discrete one. Before it the soft decoders feed concept
tokens; from it on every decoder samples discretely. The answer is the first integer on the
delimiter's line of the text after it (`problems.parse_answer`). Greedy decodes of the chosen
level's validation problems showed the model ends with "The answer is N" (or "So, the answer is
N") nearly always when asked to; "Answer: N", asked for instead, came as "The answer is N" too
(README).
"""

import dataclasses

import jax
import numpy as np

from core.errors import ConfigError
from core.nn import sampler
from methods.soft_thinking import evaluation, problems
from methods.soft_thinking.evaluation import DECODERS

INSTRUCTION = 'Think step by step, then end with "The answer is <number>."'
DELIMITER = " answer"  # must be one token id (checked)
PROMPT_ROUND = 16  # prompts are left-padded to a multiple of this: fewer compiled programs


def chains(out) -> list[list[np.ndarray]]:
    """[s][b] each decode's thinking chain: the tokens before the delimiter (the whole decode,
    eos included, when it never came). Unlike `evaluation.chains` the padding is cut off."""
    ends, lengths = out["think_end_SB"], out["length_SB"]
    return [
        [row[: end if end >= 0 else length] for row, end, length in zip(*rows, strict=True)]
        for rows in zip(out["completion_SBN"], ends, lengths, strict=True)
    ]


@dataclasses.dataclass(frozen=True)
class Prompts:
    tokens_BP: np.ndarray  # int32, left-padded
    mask_BP: np.ndarray  # bool, False on the padding
    lengths_B: np.ndarray  # real prompt tokens per row


@dataclasses.dataclass(frozen=True)
class ChatLM:
    cfg: object  # core.nn.transformer.TransformerConfig
    params: dict
    tokenizer: object

    @property
    def delimiter_id(self) -> int:
        ids = self.tokenizer.encode(DELIMITER)
        if len(ids) != 1:
            raise ConfigError(
                f"soft_thinking pretrained: DELIMITER {DELIMITER!r} is {len(ids)} tokens {ids} "
                "for this tokenizer; the delimiter must be one token id"
            )
        return int(ids[0])

    def prompts(self, batch: list[problems.Problem]) -> Prompts:
        encoded = [
            self.tokenizer.encode_chat(
                [{"role": "user", "content": f"{p.question} {INSTRUCTION}"}],
                add_generation_prompt=True,
            )
            for p in batch
        ]
        tokens, mask = sampler.left_pad(encoded, round_to=PROMPT_ROUND)
        return Prompts(tokens, mask, np.array([len(e) for e in encoded]))

    def decode(self, prompts: Prompts, *, decoder, rng, max_new_tokens, samples=1, probe=False,
               chunk=64):  # fmt: skip
        out = evaluation.decode_prompts(
            self.cfg,
            self.params,
            prompts.tokens_BP,
            prompt_mask_BP=prompts.mask_BP,
            decoder=decoder,
            rng=rng,
            think_end_id=self.delimiter_id,
            eos_id=self.tokenizer.eos_id,
            max_new_tokens=max_new_tokens,
            samples=samples,
            probe=probe,
            chunk=chunk,
        )
        return out

    def answers(self, out) -> list[list[int | None]]:
        """[s][b] the parsed answer of each decode (None: no delimiter or no number after it)."""
        parsed = []
        for rows, ends, lengths in zip(
            out["completion_SBN"], out["think_end_SB"], out["length_SB"], strict=True
        ):
            parsed.append(
                [
                    None
                    if end < 0
                    else problems.parse_answer(
                        self.tokenizer.decode(row[end + 1 : length].tolist(), skip_special=True)
                    )
                    for row, end, length in zip(rows, ends, lengths, strict=True)
                ]
            )
        return parsed

    def correct(self, out, batch: list[problems.Problem]) -> np.ndarray:
        """correct_SB: the parsed answer equals the problem's."""
        return np.array(
            [[a == p.answer for a, p in zip(s, batch, strict=True)] for s in self.answers(out)]
        )

    def greedy_accuracy(self, batch, *, max_new_tokens, rng) -> tuple[float, np.ndarray]:
        """(accuracy, lengths_B) of greedy decoding on `batch`."""
        out = self.decode(
            self.prompts(batch), decoder=DECODERS["greedy"], rng=rng, max_new_tokens=max_new_tokens
        )
        return float(self.correct(out, batch).mean()), out["length_SB"][0]

    def lens(self, prompts: Prompts, greedy, *, temperature, limit, chunk=8) -> dict:
        """The logit lens at branch points of the greedy thinking chains (right-padded
        sequences: the real prompt, then the greedy completion)."""
        rows = []
        predicts = []
        completion, ends = greedy["completion_SBN"][0], greedy["think_end_SB"][0]
        for b, length in enumerate(greedy["length_SB"][0]):
            prompt = prompts.tokens_BP[b][prompts.mask_BP[b]]
            rows.append(np.concatenate([prompt, completion[b][:length]]))
            chain = ends[b] if ends[b] >= 0 else length
            flags = np.zeros(len(rows[-1]), bool)
            flags[len(prompt) - 1 : len(prompt) - 1 + chain] = True  # these predict the chain
            predicts.append(flags)
        T = max(map(len, rows))
        sequences_BT = np.zeros((len(rows), T), np.int32)
        predicts_BT = np.zeros((len(rows), T), bool)
        for b, (seq, flags) in enumerate(zip(rows, predicts, strict=True)):
            sequences_BT[b, : len(seq)], predicts_BT[b, : len(seq)] = seq, flags
        points = evaluation.branch_points_at(
            self.cfg, self.params, sequences_BT, predicts_BT, temperature, limit, rows_chunk=chunk
        )
        return evaluation.lens_at(self.cfg, self.params, sequences_BT, points, limit=limit,
                                  chunk=chunk)  # fmt: skip


def pass_at_k_row(name: str, correct_SB: np.ndarray, ks) -> dict:
    samples = len(correct_SB)
    c_B = correct_SB.sum(0)
    return {
        f"{name}/pass@{k}": float(evaluation.pass_at_k(samples, c_B, k).mean())
        for k in ks
        if k <= samples
    }


def split_row(lm: ChatLM, batch, key, setting) -> dict:
    """One test split's metrics: greedy; every stochastic decoder of `setting.decoders`
    `setting.samples` times (pass@k, delimiter rate, ROUGE-L to the greedy chain, distinct
    chains); the JS probe on vanilla soft (one decode per problem); the logit lens."""
    prompts = lm.prompts(batch)
    greedy = lm.decode(
        prompts, decoder=DECODERS["greedy"], rng=key, max_new_tokens=setting.fixed_max_new_tokens
    )
    greedy_chains = chains(greedy)[0]
    row = {
        "greedy/pass@1": float(lm.correct(greedy, batch).mean()),
        "greedy/delimiter_rate": float((greedy["think_end_SB"] >= 0).mean()),
        "greedy/answered": float(np.mean([a is not None for a in lm.answers(greedy)[0]])),
        "greedy/length": float(greedy["length_SB"].mean()),
    }
    for index, name in enumerate(evaluation.STOCHASTIC):
        if name not in setting.decoders:
            continue
        out = lm.decode(
            prompts,
            decoder=DECODERS[name],
            rng=jax.random.fold_in(key, index + 1),
            max_new_tokens=setting.fixed_max_new_tokens,
            samples=setting.samples,
        )
        row |= pass_at_k_row(name, lm.correct(out, batch), evaluation.PASS_K)
        row[f"{name}/delimiter_rate"] = float((out["think_end_SB"] >= 0).mean())
        row[f"{name}/length"] = float(out["length_SB"].mean())
        chains_SB = chains(out)
        row[f"{name}/rouge_l_greedy"] = evaluation.agreement_with(greedy_chains, chains_SB)
        row[f"{name}/distinct_chains"] = evaluation.distinct_chains(chains_SB)
    # Vanilla soft thinking is deterministic until the delimiter: one decode per problem probes
    # it, over its first `probe_tokens` steps (the probe costs three extra forward passes).
    probed = lm.decode(
        prompts,
        decoder=DECODERS["soft"],
        rng=key,
        max_new_tokens=setting.probe_tokens,
        probe=True,
    )
    probe = evaluation.probe_summary(probed)
    row |= {f"soft/{k}": v for k, v in probe.items()}
    row["soft/js_ratio"] = probe["js_top1"] / probe["js_top2"]
    if setting.lens_limit:
        lens = lm.lens(
            prompts,
            greedy,
            temperature=DECODERS["soft"].temperature,
            limit=setting.lens_limit,
        )
        row.update(evaluation.lens_metrics(lens))
    return row
