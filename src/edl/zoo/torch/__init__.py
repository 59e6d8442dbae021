"""The zoo's PyTorch models: the same networks, data and collate as the PaddlePaddle ones beside them."""
