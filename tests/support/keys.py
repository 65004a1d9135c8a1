"""Two Fernet keys for the tests of secrets at rest (the `keys` fixture switches
between them)."""

from cryptography.fernet import Fernet

KEY_A, KEY_B = Fernet.generate_key().decode(), Fernet.generate_key().decode()
