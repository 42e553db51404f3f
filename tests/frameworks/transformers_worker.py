"""One Hugging Face Trainer run of tests/frameworks/test_transformers.py, in a process of its own
(under torchrun for two ranks):

    python transformers_worker.py CONFIG.json

CONFIG: io ("zckpt": the Trainer passed through zckpt.transformers.use_zckpt; "zckpt-async": the
same with async_save=True; or "default"), save_total_limit (the Trainer's, or null), die_writing
(a step: the process dies, as if killed, while the background write of that checkpoint's
optimizer.pt is in flight, once the Trainer has written the folder's trainer_state.json),
trainer ("subclass": a Trainer subclass of this file; "sft": TRL's SFTTrainer, on text of a word
tokenizer made here: tests/frameworks/test_trl.py), output_dir, stop_at (the step after whose checkpoint the run stops, or null to run all MAX_STEPS),
resume (resume_from_checkpoint: a folder, true, or null) and out: rank 0 writes there {"losses": [per step],
"params": {name: list}} as JSON (float.hex, so equal means bit-identical), or {"error": type,
"message", "file", "chunk", "losses"} when train raised (exit 3).
"""
import json
import os
import sys

import torch
import transformers

MAX_STEPS = 12
SAVE_STEPS = 4
EXAMPLES = 24  # 6 steps of BATCH per epoch on one rank: checkpoints fall inside and across epochs
BATCH = 4
TOKENS = 16


class Recording:
    """Mixed into a Trainer class: records every step's loss."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.losses = []

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.losses.append(float((loss[0] if isinstance(loss, tuple) else loss).detach()).hex())
        return loss


class RecordingTrainer(Recording, transformers.Trainer):
    """A subclass, as TRL's trainers are."""


class StopAfter(transformers.TrainerCallback):
    """Stops training once the checkpoint of step `step` is written (an interrupted run)."""

    def __init__(self, step):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


def tiny_model():
    config = transformers.GPT2Config(vocab_size=64, n_positions=TOKENS, n_embd=16, n_layer=2, n_head=2, bos_token_id=0,
                                     eos_token_id=0)
    torch.manual_seed(1)
    return transformers.GPT2LMHeadModel(config)


def dataset():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (EXAMPLES, TOKENS), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def word_tokenizer():
    """A tokenizer of the model's 64 ids as words t0..t63 (t0 ends and pads), made here: no download."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t1"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words, eos_token="t0", pad_token="t0", unk_token="t1")


def sft_trainer(common, callbacks):
    """TRL's SFTTrainer (recording its losses) on the same token rows as text (ids 1..63, so that
    none is the pad)."""
    import datasets
    import trl

    class RecordingSFTTrainer(Recording, trl.SFTTrainer):
        pass

    g = torch.Generator().manual_seed(0)
    rows = torch.randint(1, 64, (EXAMPLES, TOKENS - 1), generator=g)
    text = datasets.Dataset.from_dict({"text": [" ".join(f"t{int(i)}" for i in row) for row in rows]})
    args = trl.SFTConfig(**common, max_length=TOKENS)
    return RecordingSFTTrainer(model=tiny_model(), args=args, train_dataset=text, processing_class=word_tokenizer(),
                               callbacks=callbacks)


def die_while_writing(folder):
    """The process ends (os._exit, as a kill would end it) from the background write of
    folder/optimizer.pt, before a byte of it is written, once the Trainer has gone on to write the
    folder's trainer_state.json: the moment a folder looks like a checkpoint but is not one."""
    import time

    import zckpt._save as save_module

    write = save_module._save_pickled

    def dying(path, *args, **kwargs):
        if path == os.path.abspath(os.path.join(folder, "optimizer.pt")):
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(folder, "trainer_state.json")) and time.monotonic() < deadline:
                time.sleep(0.01)
            os._exit(9)
        return write(path, *args, **kwargs)

    save_module._save_pickled = dying


def main():
    config = json.load(open(sys.argv[1]))
    from zckpt.transformers import use_zckpt

    common = dict(
        output_dir=config["output_dir"], max_steps=MAX_STEPS, per_device_train_batch_size=BATCH,
        save_strategy="steps", save_steps=SAVE_STEPS, learning_rate=1e-2, warmup_steps=2,
        lr_scheduler_type="linear", weight_decay=0.01, seed=42, use_cpu=True, report_to=[],
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        save_total_limit=config.get("save_total_limit"))
    callbacks = [StopAfter(config["stop_at"])] if config.get("stop_at") else []
    if config.get("trainer") == "sft":
        trainer = sft_trainer(common, callbacks)
    else:
        trainer = RecordingTrainer(model=tiny_model(), args=transformers.TrainingArguments(**common),
                                   train_dataset=dataset(), callbacks=callbacks)
    if config["io"] in ("zckpt", "zckpt-async"):
        assert use_zckpt(trainer, async_save=config["io"] == "zckpt-async") is trainer
    if config.get("die_writing"):
        die_while_writing(os.path.join(config["output_dir"], f"checkpoint-{config['die_writing']}"))
    try:
        trainer.train(resume_from_checkpoint=config.get("resume"))
    except Exception as e:  # what the test expects of a damaged file, reported by rank 0
        if trainer.args.process_index == 0:
            json.dump({"error": type(e).__name__, "message": str(e), "file": getattr(e, "file", None),
                       "chunk": getattr(e, "chunk", None), "losses": trainer.losses}, open(config["out"], "w"))
        sys.exit(3)
    if trainer.args.process_index == 0:
        params = {n: [float(x).hex() for x in p.detach().flatten().tolist()] for n, p in trainer.model.state_dict().items()}
        json.dump({"losses": trainer.losses, "params": params, "global_step": trainer.state.global_step},
                  open(config["out"], "w"))


if __name__ == "__main__":
    main()
