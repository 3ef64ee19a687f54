from fairseq_plugins.cli.convert_transformer import main

if __name__ == "__main__":
    main()
