import time
def test_train(runs):
    print(runs)
