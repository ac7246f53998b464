"""Text: vocabularies, tokenizers, chat formats, tool-call parsers and the tool-call grammar."""
