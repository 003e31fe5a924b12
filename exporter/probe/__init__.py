"""What llama-server says: the poll, the endpoint table, answer readers and the token classifier; HTTP is in http/."""
