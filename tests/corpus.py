"""Varied System One requests that exercise every corner of the prompt format."""

from __future__ import annotations

import random


def _choice(options, instructions=None, **extra):
    q = {"type": "choice", "criteria": options, **extra}
    if instructions is not None:
        q["instructions"] = instructions
    return q


def varied_requests() -> list[dict]:
    rng = random.Random(7)
    many = {f"option-{i:03d}": f"Route number {i} ({rng.choice(['fast', 'slow', 'cheap'])})" for i in range(255)}
    ten_questions = {
        f"q{i}": ({"type": "noul", "instructions": f"Is fact {i} true?"} if i % 3 == 0 else
                  _choice({"a": "first", "b": "second", "c": None}, f"Pick for {i}") if i % 3 == 1 else
                  {"type": "score", "instructions": f"Rate {i}", "criteria": ["low", "mid", "high"]})
        for i in range(12)
    }
    reqs = [
        # all three types, string state
        {"model": "tiny", "state": "The printer on floor 3 is on fire and the CFO is asking for invoices.",
         "questions": {"is_urgent": {"type": "noul", "instructions": "Is this urgent?"},
                       "team": _choice({"it": "IT support", "billing": "Billing questions", "facilities": "Building"},
                                       "Which team should handle it?"),
                       "severity": {"type": "score", "instructions": "How severe?",
                                    "criteria": ["none", "minor", "major", "critical"]}}},
        # object state
        {"model": "tiny", "state": {"user": {"name": "Ada", "tier": "gold"}, "message": "refund please", "n": 3},
         "questions": {"refund": {"type": "noul", "instructions": "Does the user ask for a refund?"}}},
        # array state
        {"model": "tiny", "state": [{"role": "user", "text": "hi"}, {"role": "agent", "text": "hello"}, 42, None],
         "questions": {"greeting": _choice({"yes": "It is a greeting", "no": "It is not"}, "Is it a greeting?")}},
        # unicode ids, option names and text
        {"model": "tiny", "state": "Der Kunde schreibt: „Das Gerät ist kaputt“ — 日本語のテキスト 🙂",
         "questions": {"größe_問題": _choice({"klein 🐜": "kleines Problem", "groß 🐘": "großes Problem",
                                               "ñandú": "unbekannt"}, "Wie groß ist das Problem?")}},
        # 2 options
        {"model": "tiny", "state": "yes or no",
         "questions": {"pick": _choice({"left": "the left one", "right": "the right one"}, "Pick one")}},
        # 255 options
        {"model": "tiny", "state": "Find the best route among many.",
         "questions": {"route": _choice(many, "Which route?")}},
        # 2 levels and 10 levels
        {"model": "tiny", "state": "Rate it.",
         "questions": {"binary": {"type": "score", "instructions": "Good?", "criteria": ["bad", "good"]},
                       "fine": {"type": "score", "instructions": "Score 0-9",
                                "criteria": [f"level {i}" for i in range(10)]}}},
        # noul criteria: null, one-sided, two-sided, explicit null override
        {"model": "tiny", "state": "The sky is green.",
         "questions": {"n_null": {"type": "noul", "instructions": "Is the sky green?", "criteria": None},
                       "n_true": {"type": "noul", "instructions": "Is it plausible?",
                                  "criteria": {"true": "It could happen"}},
                       "n_false": {"type": "noul", "instructions": "Is it false?",
                                   "criteria": {"false": "Certainly not"}},
                       "n_both": {"type": "noul", "instructions": "Is it a lie?",
                                  "criteria": {"true": "A lie", "false": "The truth"}},
                       "n_nulled": {"type": "noul", "instructions": "Weird?", "criteria": {"true": None}}}},
        # missing and empty instructions (the id stands in)
        {"model": "tiny", "state": "No instructions given.",
         "questions": {"is_spam": {"type": "noul"},
                       "category": {"type": "choice", "instructions": "", "criteria": {"x": "X", "y": "Y"}}}},
        # null descriptions
        {"model": "tiny", "state": "Descriptions are optional.",
         "questions": {"c": _choice({"alpha": None, "beta": None, "gamma": "the third"}, "Which?")}},
        # objects and arrays as instructions and descriptions
        {"model": "tiny", "state": "Structured schema text.",
         "questions": {"obj": _choice({"a": {"label": "A", "examples": ["x", "y"]}, "b": ["B", "bee", 2]},
                                      {"task": "classify", "hints": ["short", "precise"]}),
                       "arr": {"type": "score", "instructions": ["rate", "carefully"],
                               "criteria": [{"level": "low"}, ["mid", 1], "high"]}}},
        # >= 10 questions in one request
        {"model": "tiny", "state": {"ticket": 991, "body": "Many questions at once."}, "questions": ten_questions},
        # option order in the request must not matter (code-point sort), including case and digits
        {"model": "tiny", "state": "sorting",
         "questions": {"s": _choice({"b": "bee", "B": "Bee", "a": "ay", "10": "ten", "9": "nine", "_": "under"},
                                    "sorted?")}},
        # whitespace, newlines and JSON-looking text
        {"model": "tiny", "state": "line1\n\n\tindented   spaces\r\n{\"fake\": \"json\"}",
         "questions": {"ws": {"type": "noul", "instructions": "  leading and trailing  "}}},
        # digits and long numbers
        {"model": "tiny", "state": "Order 123456789012345 costs 3.14159 EUR on 2026-11-30.",
         "questions": {"amount": {"type": "score", "instructions": "How expensive?",
                                  "criteria": ["cheap", "ok", "pricey"]}}},
        # jev-latest model name
        {"model": "jev-latest", "state": "default model",
         "questions": {"ok": {"type": "noul", "instructions": "Fine?"}}},
        # empty string state
        {"model": "tiny", "state": "", "questions": {"empty": {"type": "noul", "instructions": "Empty?"}}},
        # empty object and array states
        {"model": "tiny", "state": {}, "questions": {"e": {"type": "noul", "instructions": "Nothing?"}}},
        {"model": "tiny", "state": [], "questions": {"e": {"type": "noul", "instructions": "Nothing at all?"}}},
        # nested state with unicode keys (sort_keys orders them)
        {"model": "tiny", "state": {"zebra": 1, "Äpfel": [1, 2], "apple": {"ß": True, "a": None}},
         "questions": {"fruit": _choice({"apple": "🍎", "pear": "🍐"}, "Which fruit?")}},
        # question ids with spaces and punctuation
        {"model": "tiny", "state": "ids",
         "questions": {"is this ok?": {"type": "noul"}, "id: with colon\nand newline": {"type": "noul"}}},
        # long state (hundreds of tokens)
        {"model": "tiny", "state": " ".join(f"word{i}" for i in range(400)),
         "questions": {"long": {"type": "noul", "instructions": "Is it long?"}}},
        # mixed router request: 4 questions, 19 options
        {"model": "tiny", "state": {"prompt": "Write a haiku about databases", "history": []},
         "questions": {"needs_tools": {"type": "noul", "instructions": "Does it need tools?"},
                       "model": _choice({"small": "fast cheap", "medium": "balanced", "large": "smart",
                                         "code": "code model", "vision": "images", "long": "long context",
                                         "math": "math"}, "Which model?"),
                       "difficulty": {"type": "score", "instructions": "How hard?",
                                      "criteria": ["trivial", "easy", "medium", "hard", "expert"]},
                       "domain": _choice({"creative": "writing", "tech": "technical", "chat": "smalltalk",
                                          "biz": "business", "sci": "science"}, "Domain?")}},
        # descriptions with quotes and backslashes
        {"model": "tiny", "state": "quotes \"here\" and \\backslash\\",
         "questions": {"q": _choice({"\"quoted\"": "has \"quotes\"", "back\\slash": "has \\"}, "Which?")}},
        # unicode normalization forms and combining marks
        {"model": "tiny", "state": "café vs cafe\u0301, Ångström, ﬁ ligature, क्षत्रिय, កាន់តែ",
         "questions": {"u": {"type": "noul", "instructions": "Unicode?"}}},
        # score with duplicate level texts
        {"model": "tiny", "state": "duplicates",
         "questions": {"d": {"type": "score", "instructions": "Dup?", "criteria": ["same", "same", "same"]}}},
        # choice whose names look like numbers and booleans
        {"model": "tiny", "state": "typed-looking names",
         "questions": {"t": _choice({"true": "yes", "false": "no", "0": "zero", "null": "nothing"}, "Which?")}},
        # extra unknown top-level fields are ignored
        {"model": "tiny", "state": "extra fields", "x_trace": "abc", "temperature": 3,
         "questions": {"x": {"type": "noul", "instructions": "Ignored extras?", "x_note": 1}}},
        # decomposed (NFD) text: the release's tokenizer NFC-normalizes it, llama.cpp on its own does not
        {"model": "tiny", "state": "Cafe\u0301 de\u0301ja\u0300 vu at the Ko\u0308ln office, n\u0303 and \u212b",
         "questions": {"lieu": _choice({"cafe\u0301": "the cafe\u0301", "Ko\u0308ln": "die Stadt"}, "Wo\u0301?"),
                       "re\u0301el": {"type": "noul", "instructions": "Is it re\u0301al?"}}},
    ]
    return reqs
