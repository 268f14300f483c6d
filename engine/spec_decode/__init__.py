"""Speculative decoding: proposers guess a request's next tokens, one forward verifies them."""
