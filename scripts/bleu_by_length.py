from fairseq_plugins.cli.bleu_by_length import main

if __name__ == "__main__":
    main()
