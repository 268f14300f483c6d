"""Multi-LoRA: PEFT adapters on the decoder's linear layers, several per batch."""
