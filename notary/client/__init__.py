"""The client side: `notary check` (asking several notaries and voting), watches, and the user's trusted notary bundles."""
