"""transformers' distributed checkpoint helpers (transformers.distributed.checkpoint), for
fw_flows.py: the model saved as sharded safetensors through torch's HuggingFaceStorageWriter
(which hyperdcp hands to torch), the optimizer through dcp.save/dcp.load (which hyperdcp serves),
then both loaded into a freshly built FSDP2 model and checked bit for bit."""

import torch


def flow_transformers(fw) -> dict:
    """`fw`: fw_flows, the running worker (its helpers, rank and output directory)."""
    if fw.framework("transformers") is None:
        return None
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.distributed.checkpoint import (_load_model_checkpoint_distributed,
                                                     _save_model_checkpoint_distributed,
                                                     load_optimizer_distributed,
                                                     save_optimizer_distributed)

    fw.init_gloo()
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

    def build(seed: int):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)

    def step(model, optim, n: int) -> None:
        ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(n + fw.RANK))
        model(input_ids=ids, labels=ids).loss.backward()
        optim.step()
        optim.zero_grad()

    model, optim = build(0)
    for n in range(2):
        step(model, optim, n)
    _save_model_checkpoint_distributed(model, fw.OUT / "tf-model")
    save_optimizer_distributed(model, optim, str(fw.OUT / "tf-optim"))
    ref = fw.full_state(model, optim)
    fw.check_saved(fw.OUT / "tf-optim")  # served by the mode's library

    model, optim = build(1)  # other initial values and a step of its own, then the resume
    step(model, optim, 7)
    _load_model_checkpoint_distributed(model, fw.OUT / "tf-model")
    load_optimizer_distributed(model, optim, str(fw.OUT / "tf-optim"))
    got = fw.full_state(model, optim)
    if fw.RANK == 0:
        fw.assert_equal(got, ref, "transformers resumed")
    return fw.flatten(got, "resumed", {})
