"""Networks shared by more than one method."""
