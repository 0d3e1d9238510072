"""A library-style output type for the import tests: a dataclass registered with torch's pytree
under a serialized name, as Hugging Face registers its ``ModelOutput`` classes."""

import dataclasses

import torch


@dataclasses.dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor
    pooled: torch.Tensor


torch.export.register_dataclass(EncoderOutput, serialized_type_name="pytree_types.EncoderOutput")


class Encoder(torch.nn.Module):
    """Keyword inputs, an in-place residual, a dataclass output."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, input_embeds, *, attention_mask):
        h = self.a(input_embeds)
        h += self.b(input_embeds)  # in place, as model libraries write residuals
        h = torch.tanh(h) * attention_mask
        return EncoderOutput(h, h.mean(1))
