from __future__ import annotations

import pytest

from mythic.engine import ChatFormat, ChatMessage

pytestmark = pytest.mark.unit

MESSAGES = [
    ChatMessage("system", "You are Marla."),
    ChatMessage("user", "Hello"),
    ChatMessage("assistant", "Evening, friend."),
    ChatMessage("user", "A room?"),
]


def test_chatml_renders_every_turn_and_opens_the_reply() -> None:
    assert ChatFormat.CHATML.render(MESSAGES) == (
        "<|im_start|>system\nYou are Marla.<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\nEvening, friend.<|im_end|>\n"
        "<|im_start|>user\nA room?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_llama3_renders_headers() -> None:
    text = ChatFormat.LLAMA3.render(MESSAGES[:2], add_generation_prompt=False)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are Marla.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
    )


def test_gemma_folds_the_system_prompt_into_the_first_user_turn() -> None:
    text = ChatFormat.GEMMA.render(MESSAGES)
    assert text.startswith("<bos><start_of_turn>user\nYou are Marla.\n\nHello<end_of_turn>\n")
    assert "<start_of_turn>model\nEvening, friend.<end_of_turn>\n" in text
    assert text.endswith("<start_of_turn>user\nA room?<end_of_turn>\n<start_of_turn>model\n")
    assert text.count("You are Marla.") == 1


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}", ChatFormat.CHATML),
        ("<|start_header_id|>{{ role }}<|end_header_id|>", ChatFormat.LLAMA3),
        ("<start_of_turn>user", ChatFormat.GEMMA),
        ("[INST] {{ content }} [/INST]", None),
        (None, None),
        ("", None),
    ],
)
def test_detect_from_a_gguf_template(template: str | None, expected: ChatFormat | None) -> None:
    assert ChatFormat.detect(template) is expected


def test_every_format_has_stop_strings() -> None:
    for fmt in ChatFormat:
        assert fmt.stop_strings
