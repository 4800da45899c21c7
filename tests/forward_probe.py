"""Records what a model's forwards are fed, on any path (``model(...)``, ``generate`` or the direct forward)."""


def recording_forward(model, monkeypatch) -> list[tuple[int, int]]:
    """The ``input_ids`` shapes of every forward of ``model`` from now on (what enters its token embedding, on
    any path)."""
    shapes, embed = [], model.model.embed_tokens
    forward = embed.forward
    monkeypatch.setattr(embed, "forward", lambda input_ids: shapes.append(tuple(input_ids.shape)) or forward(input_ids))
    return shapes
