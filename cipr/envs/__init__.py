"""Environments an agent acts in: the protocol (`base`), ToyShop (`toyshop`), BFCL's multi-turn categories
(`bfcl_multi_turn`), WebShop where installed (`webshop`), and `registry.make_env` to build one by name."""
