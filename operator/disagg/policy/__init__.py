"""Pure ratio policy: observation -> decision, with reasons."""
